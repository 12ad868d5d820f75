"""tests/integration/test_attrs.py - modes, owners and times persist (docs/semantics.md §13,
"Modes, owners and times"); several users on one mount (docs/operations.md, "Several
users on one mount"); special files and hard links are refused.

Run on s3rver and a local directory, through real mounts; the round trips with rsync, cp
and tar compare the trees they bring back to the originals exactly.
"""

import errno
import os
import shutil
import stat
import subprocess
import threading
import time

import pytest

import harness

FSYNC_MODES = ["remote", "staged"]
PAST = 1_500_000_000  # 2017-07-14, whole seconds (tar keeps seconds)
PAST_NS = 1_400_000_000_123_456_789



def exact(store):
    """Mount options for a fresh mount to see attributes other mounts set: on S3 a listing
    carries none, so it asks (--attrs=exact); a local directory has them anyway."""
    return ["--attrs=exact"] if isinstance(store, harness.S3Store) else []


def attrs(path):
    st = os.stat(path)
    return (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid,
            st.st_mtime_ns)


def test_mode_owner_time_defaults_without_metadata(both_stores, mounter):
    """§13: an object nobody set attributes on shows the defaults (0644, the mounting user)."""
    both_stores.put("plain.bin", b"x" * 10)
    m = mounter(both_stores)
    st = os.stat(m.p("plain.bin"))
    assert stat.S_IMODE(st.st_mode) == 0o644 and (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())


@pytest.mark.parametrize("fsync", FSYNC_MODES)
def test_chmod_chown_utime_are_stored_and_returned(both_stores, mounter, fsync):
    """§13: set on a stored file, on a staged (open)
    file, on a directory: the writing mount shows them at once and after the upload, and
    a fresh mount shows them too."""
    m = mounter(both_stores, f"--fsync={fsync}")
    with open(m.p("stored.bin"), "wb") as f:
        f.write(b"s" * 1000)
    m.sync()
    os.chmod(m.p("stored.bin"), 0o600)
    os.chown(m.p("stored.bin"), 1234, 1235)
    os.utime(m.p("stored.bin"), ns=(PAST_NS, PAST_NS))
    with open(m.p("staged.bin"), "wb") as f:  # cp -p's order: set on the open file
        f.write(b"t" * 1000)
        f.flush()
        os.fchmod(f.fileno(), 0o751)
        os.utime(f.fileno(), ns=(PAST_NS, PAST_NS))
    os.mkdir(m.p("d"))
    subprocess.run(["touch", "-d", "@1500000000", m.p("d")], check=True)
    os.chmod(m.p("d"), 0o750)
    want = {"stored.bin": (stat.S_IFREG, 0o600, 1234, 1235, PAST_NS),
            "staged.bin": (stat.S_IFREG, 0o751, 0, 0, PAST_NS),
            "d": (stat.S_IFDIR, 0o750, 0, 0, PAST * 10**9)}
    assert {n: attrs(m.p(n)) for n in want} == want
    m.sync()
    assert {n: attrs(m.p(n)) for n in want} == want, "after the upload"
    fresh = mounter(both_stores, *exact(both_stores))
    assert {n: attrs(fresh.p(n)) for n in want} == want, "on a fresh mount"
    assert fresh.p("stored.bin") and open(fresh.p("stored.bin"), "rb").read() == b"s" * 1000


def make_tree(root):
    """A small tree with the modes and times tools must keep: files 0600/0750/0755/0644,
    directories 0750/0755, past mtimes."""
    os.makedirs(os.path.join(root, "a", "b"))
    files = {"top.txt": 0o644, "a/secret": 0o600, "a/run.sh": 0o750, "a/b/tool": 0o755,
             "a/b/data.bin": 0o644}
    for i, (rel, mode) in enumerate(sorted(files.items())):
        p = os.path.join(root, rel)
        with open(p, "wb") as f:
            f.write(harness.data(1000 + 977 * i, seed=i))
        os.chmod(p, mode)
        os.utime(p, (PAST + i, PAST + i))
    os.chmod(os.path.join(root, "a"), 0o750)
    for i, d in enumerate(["a/b", "a", "."]):
        os.utime(os.path.join(root, d), (PAST + 100 + i, PAST + 100 + i))



@pytest.mark.parametrize("fsync", FSYNC_MODES)
def test_rsync_cp_tar_round_trip_a_tree_exactly(both_stores, mounter, fsync, tmp_path):
    """rsync -a, cp -a and tar into the mount and back out to local disk give the tree
    back exactly: content, modes, mtimes (§13)."""
    src = str(tmp_path / "src")
    make_tree(src)
    want = harness.tree_snapshot(src)
    m = mounter(both_stores, f"--fsync={fsync}")
    back = tmp_path / "back"
    back.mkdir()
    subprocess.run(["rsync", "-a", src + "/", m.p("rsync") + "/"], check=True)
    subprocess.run(["cp", "-a", src, m.p("cp")], check=True)
    os.mkdir(m.p("tar"))
    subprocess.run(f"tar -C {src} -cf - . | tar -C {m.p('tar')} -xpf -", shell=True, check=True)
    assert harness.tree_snapshot(m.p("rsync")) == want
    assert harness.tree_snapshot(m.p("cp")) == want
    assert harness.tree_snapshot(m.p("tar")) == want
    subprocess.run(["rsync", "-a", m.p("rsync") + "/", str(back / "rsync") + "/"], check=True)
    subprocess.run(["cp", "-a", m.p("cp"), str(back / "cp")], check=True)
    os.mkdir(back / "tar")
    subprocess.run(f"tar -C {m.p('tar')} -cf - . | tar -C {back / 'tar'} -xpf -", shell=True,
                   check=True)
    for name in ("rsync", "cp", "tar"):
        assert harness.tree_snapshot(str(back / name)) == want, name
    m.sync()
    fresh = mounter(both_stores, *exact(both_stores))
    for name in ("rsync", "cp", "tar"):
        assert harness.tree_snapshot(fresh.p(name)) == want, f"{name} on a fresh mount"


@pytest.mark.parametrize("fsync", FSYNC_MODES)
def test_rename_right_after_close_always_finds_the_file(tmp_path, mounter, fsync):
    """rsync closes each temporary file and renames it at once, while the kernel's
    release of that file may still be on its way: the rename must find the file whether
    it is still staged or has just left staging for the store. It did not (a clean file
    could leave staging between the rename's lookup and its move): rsync failed 'rename
    .f169.b331tG -> f169: No such file or directory' in 1 to 5 of 20 runs of 300 files."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(300):
        (src / f"f{i}").write_bytes(harness.data(1 + 37 * i, seed=i))
    m = mounter(harness.DirStore(str(tmp_path / "store")), f"--fsync={fsync}")
    for run in range(8):
        dst = m.p(f"r{run}")
        r = subprocess.run(["rsync", "-a", str(src) + "/", dst + "/"], capture_output=True,
                           text=True)
        assert r.returncode == 0, f"run {run}: {r.stderr.strip()[-300:]}"
    assert harness.tree_snapshot(m.p("r7")) == harness.tree_snapshot(str(src))


def test_chmod_of_a_large_stored_object_copies_it_onto_itself(dedicated_s3server, mounter):
    """§13: a new file's mode goes with its (multipart) upload; setting attributes of a
    stored object sends no bytes again: one metadata-only CopyObject (no PUT, no part)
    per call, and the object's bytes stay as they were."""
    s = harness.S3Store(dedicated_s3server, "big")
    body = harness.data(12 << 20, seed=3)
    m = mounter(s)
    fd = os.open(m.p("big.bin"), os.O_WRONLY | os.O_CREAT, 0o600)  # a multipart upload
    with os.fdopen(fd, "wb") as f:
        f.write(body)
    m.sync()
    meta = s.s3.head_object(Bucket=s.bucket, Key=s.key("big.bin"))["Metadata"]
    assert meta == {"mode": str(stat.S_IFREG | 0o600)}, "sent with CreateMultipartUpload"
    before = m.stats()["write"]
    os.chmod(m.p("big.bin"), 0o640)
    os.utime(m.p("big.bin"), (PAST, PAST))
    after = m.stats()["write"]
    sent = {k: after[k] - before[k] for k in ("put_requests", "part_requests", "copy_requests",
                                             "mpu_begin_requests")}
    assert sent == {"put_requests": 0, "part_requests": 0, "copy_requests": 2,
                    "mpu_begin_requests": 0}
    assert s.get("big.bin") == body
    fresh = mounter(s, "--attrs=exact")
    assert attrs(fresh.p("big.bin"))[1:] == (0o640, 0, 0, PAST * 10**9)


def test_a_chmod_while_the_upload_lands_is_kept(s3server, mounter, faultproxy):
    """§13: attributes set while the file's upload lands are not lost. A proxy holds the
    PUT (a chmod meanwhile is taken by the landing: a CopyObject onto itself), then holds
    that copy: a second chmod while it is under way must reach the object too, and the
    mount must show it."""
    s = harness.S3Store(s3server, harness.unique_prefix("landing"))
    held = {"PUT": threading.Event(), "COPY": threading.Event()}
    go = {"PUT": threading.Event(), "COPY": threading.Event()}

    def gate(req):  # hold the first PUT and the first copy of f.bin until told
        if req.method == "PUT" and req.path.endswith("/f.bin"):
            kind = "COPY" if "x-amz-copy-source" in req.headers else "PUT"
            if not held[kind].is_set():
                held[kind].set()
                go[kind].wait(60)
        return "pass"

    proxy = faultproxy(s3server.port, policy=gate)
    m = mounter(s, "--fsync=staged", endpoint=proxy.endpoint)
    try:
        with open(m.p("f.bin"), "wb") as f:
            f.write(b"x" * 1000)
        assert held["PUT"].wait(60), "the upload began"
        os.chmod(m.p("f.bin"), 0o600)
        go["PUT"].set()
        assert held["COPY"].wait(60), "the landing gave the object the new mode"
        os.chmod(m.p("f.bin"), 0o640)  # while that copy is under way
    finally:
        go["PUT"].set()
        go["COPY"].set()
    m.sync()
    meta = s.s3.head_object(Bucket=s.bucket, Key=s.key("f.bin"))["Metadata"]
    print("DEBUG", proxy.log)
    assert meta.get("mode") == str(stat.S_IFREG | 0o640), meta
    assert stat.S_IMODE(os.stat(m.p("f.bin")).st_mode) == 0o640
    assert s.get("f.bin") == b"x" * 1000


def as_user(uid, *cmd):
    """Run cmd as uid (and gid uid, no supplementary groups)."""
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                           *cmd], capture_output=True, text=True)


@pytest.fixture
def traversable(tmp_path):
    """Let other users reach the test's folder (pytest makes its parents 0700)."""
    changed = []
    p = str(tmp_path)
    while p.startswith("/tmp/pytest-of-"):
        mode = stat.S_IMODE(os.stat(p).st_mode)
        if mode & 0o001 == 0:
            os.chmod(p, mode | 0o001)
            changed.append((p, mode))
        p = os.path.dirname(p)
    yield
    for p, mode in changed:
        os.chmod(p, mode)


def test_several_users_on_one_mount(both_stores, mounter, traversable):
    """docs/operations.md "Several users on one mount": with -o allow_other and
    default_permissions the kernel enforces the stored modes and owners: a file of uid
    1234 is read by uid 4321 as its mode allows and refused otherwise, also on a fresh
    mount."""
    opts = ["-o", "allow_other,default_permissions", *exact(both_stores)]
    m = mounter(both_stores, *opts)
    os.mkdir(m.p("shared"))
    os.chmod(m.p("shared"), 0o777)
    r = as_user(1234, "sh", "-c", f"umask 022; echo hello > {m.p('shared/mine')}")
    assert r.returncode == 0, r.stderr
    st = os.stat(m.p("shared/mine"))
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1234, 1234, 0o644)
    assert as_user(4321, "cat", m.p("shared/mine")).stdout == "hello\n"
    assert as_user(1234, "chmod", "600", m.p("shared/mine")).returncode == 0
    r = as_user(4321, "cat", m.p("shared/mine"))
    assert r.returncode != 0 and "Permission denied" in r.stderr
    assert as_user(1234, "cat", m.p("shared/mine")).stdout == "hello\n"
    r = as_user(4321, "chmod", "644", m.p("shared/mine"))
    assert r.returncode != 0, "only the owner may change the mode"
    m.sync()
    fresh = mounter(both_stores, *opts)
    r = as_user(4321, "cat", fresh.p("shared/mine"))
    assert r.returncode != 0 and "Permission denied" in r.stderr, "refused on a fresh mount"
    assert as_user(1234, "cat", fresh.p("shared/mine")).stdout == "hello\n"


def test_special_files_and_hard_links_are_refused(both_stores, mounter):
    """§13: mkfifo and mknod fail with EPERM, link
    with EPERM; a regular file made by mknod works."""
    m = mounter(both_stores)
    with open(m.p("f"), "wb") as f:
        f.write(b"x")
    for make in (lambda p: os.mkfifo(p), lambda p: os.mknod(p, 0o600 | stat.S_IFCHR, os.makedev(1, 3)),
                 lambda p: os.mknod(p, 0o600 | stat.S_IFSOCK)):
        with pytest.raises(OSError) as e:
            make(m.p("special"))
        assert e.value.errno == errno.EPERM
    with pytest.raises(OSError) as e:
        os.link(m.p("f"), m.p("g"))
    assert e.value.errno == errno.EPERM
    os.mknod(m.p("regular"), 0o600 | stat.S_IFREG)
    assert stat.S_IMODE(os.stat(m.p("regular")).st_mode) == 0o600
    assert not os.path.exists(m.p("special")) and not os.path.exists(m.p("g"))


@pytest.fixture
def s3fs_mounter(tmp_path):
    """s3fs-fuse mounts of an s3rver bucket prefix: s3fs_mounter(store) -> mountpoint;
    every one is unmounted (fusermount3 -u) and its process reaped at the end."""
    if not shutil.which("s3fs"):
        pytest.skip("s3fs is not installed")
    procs = []
    passwd = tmp_path / "s3fs-passwd"
    passwd.write_text(f"{harness.S3_KEY}:{harness.S3_SECRET}\n")
    os.chmod(passwd, 0o600)

    def make(store):
        mnt = tmp_path / f"s3fs{len(procs)}"
        mnt.mkdir()
        bucket = f"{store.bucket}:/{store.prefix}" if store.prefix else store.bucket
        p = subprocess.Popen(["s3fs", bucket, str(mnt), "-f", "-o",
                              f"url={store.server.endpoint},use_path_request_style,"
                              f"passwd_file={passwd},stat_cache_expire=1,enable_noobj_cache"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append((p, str(mnt)))
        deadline = time.monotonic() + 10
        while not os.path.ismount(str(mnt)):
            assert p.poll() is None and time.monotonic() < deadline, "s3fs did not mount"
            time.sleep(0.05)
        return str(mnt)

    yield make
    for p, mnt in procs:
        subprocess.run(["fusermount3", "-u", mnt], stderr=subprocess.DEVNULL)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_attributes_are_s3fs_compatible(s3server, mounter, s3fs_mounter):
    """§13: the metadata is s3fs's (x-amz-meta-mode/uid/gid/mtime): a mode, owner and time set
    through ckptfs show through s3fs on the same bucket, and those set through s3fs show
    through ckptfs (--attrs=exact, as a listing carries none)."""
    store = harness.S3Store(s3server, harness.unique_prefix("s3fs-interop"))
    m = mounter(store)
    with open(m.p("ours.bin"), "wb") as f:
        f.write(b"o" * 100)
    m.sync()
    os.chmod(m.p("ours.bin"), 0o640)
    os.chown(m.p("ours.bin"), 1234, 1235)
    os.utime(m.p("ours.bin"), (PAST, PAST))
    theirs = s3fs_mounter(store)
    assert attrs(os.path.join(theirs, "ours.bin")) == (stat.S_IFREG, 0o640, 1234, 1235,
                                                     PAST * 10**9)
    with open(os.path.join(theirs, "theirs.bin"), "wb") as f:
        f.write(b"t" * 100)
    os.chmod(os.path.join(theirs, "theirs.bin"), 0o600)
    os.chown(os.path.join(theirs, "theirs.bin"), 4321, 4322)
    os.utime(os.path.join(theirs, "theirs.bin"), (PAST + 7, PAST + 7))
    fresh = mounter(store, "--attrs=exact")
    assert attrs(fresh.p("theirs.bin")) == (stat.S_IFREG, 0o600, 4321, 4322, (PAST + 7) * 10**9)


@pytest.mark.parametrize("fsync", FSYNC_MODES)
def test_rewriting_a_file_keeps_its_mode_and_owner(both_stores, mounter, fsync):
    """§13: a file opened for writing (appended to, or truncated), or cut by truncate(2)
    on its path, keeps the mode and owner it had; its time becomes the write's."""
    m = mounter(both_stores, f"--fsync={fsync}")
    names = ("appended", "truncated", "cut")
    for name in names:
        with open(m.p(name), "wb") as f:
            f.write(b"1" * 100)
    m.sync()
    for name in names:
        os.chmod(m.p(name), 0o600)
        os.chown(m.p(name), 1234, 1235)
        os.utime(m.p(name), (PAST, PAST))
    with open(m.p("appended"), "ab") as f:
        f.write(b"2")
    with open(m.p("truncated"), "wb") as f:
        f.write(b"3")
    os.truncate(m.p("cut"), 10)  # truncate -s: no open file
    m.sync()
    assert os.path.getsize(m.p("cut")) == 10
    fresh = mounter(both_stores, *exact(both_stores))
    for mnt in (m, fresh):
        for name in names:
            got = attrs(mnt.p(name))
            assert got[:4] == (stat.S_IFREG, 0o600, 1234, 1235) and got[4] > PAST * 10**9, name


def test_a_stored_file_renamed_to_metadata_keeps_its_mode_and_owner(both_stores, mounter):
    """§13, rename keeps them: also a rename onto a checkpoint's .metadata, which stages a
    copy of the stored bytes (it must wait for the files it names) instead of a copy on
    the store."""
    m = mounter(both_stores)
    os.makedirs(m.p("ck"))
    with open(m.p("ck/.metadata.tmp"), "wb") as f:
        f.write(b"not a pickle")
    m.sync()
    os.chmod(m.p("ck/.metadata.tmp"), 0o600)
    os.chown(m.p("ck/.metadata.tmp"), 1234, 1235)
    os.rename(m.p("ck/.metadata.tmp"), m.p("ck/.metadata"))
    m.sync()
    fresh = mounter(both_stores, *exact(both_stores))
    for mnt in (m, fresh):
        assert attrs(mnt.p("ck/.metadata"))[:4] == (stat.S_IFREG, 0o600, 1234, 1235), mnt.n
        with open(mnt.p("ck/.metadata"), "rb") as f:
            assert f.read() == b"not a pickle"
