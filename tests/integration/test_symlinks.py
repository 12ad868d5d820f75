"""tests/integration/test_symlinks.py - symbolic links (docs/semantics.md §14, "Symbolic
links"): symlink, readlink, lstat, listings, following by the kernel, rename and unlink, a
link in a renamed directory; stored as s3fs stores them on S3 (read both ways with a real
s3fs 1.90 mount) and as real links on a local directory; a link goes to the store only
after what was staged at or below its target; the lookup rule that asks the store (one
HEAD) only for small non-checkpoint objects; rsync -a, cp -a and tar round trips.

Run on s3rver and a local directory, through real mounts.
"""

import os
import shutil
import stat
import subprocess
import time

import pytest

import harness

FSYNC_MODES = ["remote", "staged"]
LINK_MODE = stat.S_IFLNK | 0o777  # what s3fs writes in x-amz-meta-mode (41471)



def stored_link(store, rel):
    """The target of the link rel as the store holds it, or None if it is not there."""
    if isinstance(store, harness.S3Store):
        try:
            head = store.s3.head_object(Bucket=store.bucket, Key=store.key(rel))
        except store.s3.exceptions.ClientError:
            return None
        assert head["Metadata"].get("mode") == str(LINK_MODE), head["Metadata"]
        return store.get(rel).decode()
    p = os.path.join(store.root, rel)
    if not os.path.lexists(p):
        return None
    assert os.path.islink(p), f"{rel} is not a real link on the local store"
    return os.readlink(p)


def check_links(root):
    """What a mount (or s3fs) must show of the links the tests make under root."""
    # A listing first (on a fresh mount: before any lookup has learnt what the names are)
    kinds = {e.name: (e.is_symlink(), e.is_dir()) for e in os.scandir(os.path.join(root, "ck"))}
    assert kinds == {"latest": (True, True), "file.lnk": (True, False),
                     "dangling": (True, False), "step_2": (False, True)}
    assert os.readlink(os.path.join(root, "ck/latest")) == "step_2"
    assert stat.S_ISLNK(os.lstat(os.path.join(root, "ck/latest")).st_mode)
    assert os.lstat(os.path.join(root, "ck/latest")).st_size == len("step_2")
    assert stat.S_ISDIR(os.stat(os.path.join(root, "ck/latest")).st_mode)  # followed
    assert open(os.path.join(root, "ck/latest/w.bin"), "rb").read() == b"w2" * 500
    assert open(os.path.join(root, "ck/file.lnk"), "rb").read() == b"w2" * 500
    assert os.readlink(os.path.join(root, "ck/dangling")) == "../nowhere/x"
    assert not os.path.exists(os.path.join(root, "ck/dangling"))


def make_links(root):
    os.makedirs(os.path.join(root, "ck/step_2"))
    with open(os.path.join(root, "ck/step_2/w.bin"), "wb") as f:
        f.write(b"w2" * 500)
    os.symlink("step_2", os.path.join(root, "ck/latest"))
    os.symlink("step_2/w.bin", os.path.join(root, "ck/file.lnk"))
    os.symlink("../nowhere/x", os.path.join(root, "ck/dangling"))  # not validated (POSIX)


@pytest.mark.parametrize("fsync", FSYNC_MODES)
def test_symlink_readlink_lstat_listing_and_following(both_stores, mounter, fsync):
    """§14: a link shows as a link at once (staged), on the store after sync (S3: an object
    holding the target with x-amz-meta-mode S_IFLNK|0777; local: a real link), and on a
    fresh mount without --attrs=exact; rename and unlink of a link; a link in a renamed
    directory; symlink over an existing name is EEXIST."""
    m = mounter(both_stores, f"--fsync={fsync}")
    make_links(m.p())
    check_links(m.p())
    with pytest.raises(FileExistsError):
        os.symlink("x", m.p("ck/latest"))
    m.sync()
    check_links(m.p())
    assert stored_link(both_stores, "ck/latest") == "step_2"
    assert stored_link(both_stores, "ck/dangling") == "../nowhere/x"
    fresh = mounter(both_stores)
    check_links(fresh.p())
    os.rename(fresh.p("ck/dangling"), fresh.p("ck/dangling2"))
    os.unlink(fresh.p("ck/file.lnk"))
    os.rename(fresh.p("ck"), fresh.p("ck-moved"))  # a stored directory with links in it
    fresh.sync()
    assert stored_link(both_stores, "ck-moved/dangling2") == "../nowhere/x"
    assert stored_link(both_stores, "ck-moved/latest") == "step_2"
    assert stored_link(both_stores, "ck-moved/file.lnk") is None
    assert stored_link(both_stores, "ck/latest") is None
    again = mounter(both_stores)
    assert os.readlink(again.p("ck-moved/latest")) == "step_2"
    assert open(again.p("ck-moved/latest/w.bin"), "rb").read() == b"w2" * 500
    assert sorted(os.listdir(again.p("ck-moved"))) == ["dangling2", "latest", "step_2"]
    subprocess.run(["ln", "-sfn", "step_2/w.bin", again.p("ck-moved/dangling2")], check=True)
    assert os.readlink(again.p("ck-moved/dangling2")) == "step_2/w.bin"  # replaced
    again.sync()
    assert stored_link(both_stores, "ck-moved/dangling2") == "step_2/w.bin"


def test_link_is_published_after_the_files_below_its_target(both_stores, mounter):
    """§14: a link made while a file below its target is still being written reaches the
    store only after that file did, even when later files are already on the store."""
    m = mounter(both_stores, "--fsync=staged")
    os.makedirs(m.p("run/step_1"))
    f = open(m.p("run/step_1/shard.bin"), "wb")
    try:
        f.write(b"s" * 4096)
        f.flush()  # still open: not sealed, not uploaded
        os.symlink("step_1", m.p("run/latest"))
        with open(m.p("later.bin"), "wb") as g:  # made after the link: not waited for
            g.write(b"l" * 100)
        deadline = time.monotonic() + 30 * harness.slow_factor()
        while both_stores.size("later.bin") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert both_stores.size("later.bin") == 100, "a later file is published meanwhile"
        time.sleep(0.3)  # the link, were it not held, would be sent by now
        assert stored_link(both_stores, "run/latest") is None, "the link went before its target's file"
        assert os.readlink(m.p("run/latest")) == "step_1", "the mount shows it meanwhile"
    finally:
        f.close()
    m.sync()
    assert both_stores.get("run/step_1/shard.bin") == b"s" * 4096
    assert stored_link(both_stores, "run/latest") == "step_1"


def test_a_staged_link_survives_kill9(both_stores, mounter, tmp_path):
    """§14: a link still held back (a file below its target is open) when the daemon is
    killed is journaled as a link: the next mount with the same --cache-dir publishes it
    as a link, not as a file holding its target."""
    cache = str(tmp_path / "cache-crash")
    a = mounter(both_stores, "--fsync=staged", cache_dir=cache)
    os.makedirs(a.p("run/step_1"))
    f = open(a.p("run/step_1/shard.bin"), "wb")
    f.write(b"s" * 100)
    f.flush()
    os.symlink("step_1", a.p("run/latest"))
    a.proc.kill()  # the daemon dies with the file open...
    try:
        f.close()
    except OSError:
        pass  # (the mount is gone)
    a.kill9()  # ... then the dead mount is cleared
    assert stored_link(both_stores, "run/latest") is None
    b = mounter(both_stores, "--fsync=staged", cache_dir=cache)
    b.sync()
    assert stored_link(both_stores, "run/latest") == "step_1"
    assert os.readlink(b.p("run/latest")) == "step_1"



@pytest.mark.parametrize("fsync", FSYNC_MODES)
def test_rsync_cp_tar_round_trip_links(both_stores, mounter, fsync, tmp_path):
    """§14: rsync -a, cp -a and tar of a tree with links into the mount and back out give
    it back exactly (links as links, their targets; files' content, modes, times)."""
    src = str(tmp_path / "src")
    os.makedirs(os.path.join(src, "step_1"))
    with open(os.path.join(src, "step_1", "a.bin"), "wb") as f:
        f.write(harness.data(3000, seed=1))
    os.utime(os.path.join(src, "step_1", "a.bin"), (1_500_000_000, 1_500_000_000))
    os.symlink("step_1", os.path.join(src, "latest"))
    os.symlink("/abs/elsewhere", os.path.join(src, "abs"))
    os.symlink("step_1/a.bin", os.path.join(src, "step_1.bin"))
    for link in ("latest", "abs", "step_1.bin"):  # links have times of their own (lutimes)
        os.utime(os.path.join(src, link), (1_500_000_200, 1_500_000_200), follow_symlinks=False)
    os.utime(os.path.join(src, "step_1"), (1_500_000_100, 1_500_000_100))
    want = harness.tree_snapshot(src)
    m = mounter(both_stores, f"--fsync={fsync}")
    subprocess.run(["rsync", "-a", src + "/", m.p("rsync") + "/"], check=True)
    subprocess.run(["cp", "-a", src, m.p("cp")], check=True)
    os.mkdir(m.p("tar"))
    subprocess.run(f"tar -C {src} -cf - . | tar -C {m.p('tar')} -xpf -", shell=True, check=True)
    for name in ("rsync", "cp", "tar"):
        assert harness.tree_snapshot(m.p(name)) == want, name
    back = tmp_path / "back"
    back.mkdir()
    subprocess.run(["rsync", "-a", m.p("rsync") + "/", str(back / "rsync") + "/"], check=True)
    subprocess.run(["cp", "-a", m.p("cp"), str(back / "cp")], check=True)
    os.mkdir(back / "tar")
    subprocess.run(f"tar -C {m.p('tar')} -cf - . | tar -C {back / 'tar'} -xpf -", shell=True,
                   check=True)
    for name in ("rsync", "cp", "tar"):
        assert harness.tree_snapshot(str(back / name)) == want, f"{name} back out"
    m.sync()
    # Links show on any mount; the files' modes and times on S3 with --attrs=exact (§13).
    fresh = mounter(both_stores, *(["--attrs=exact"] if isinstance(both_stores, harness.S3Store) else []))
    for name in ("rsync", "cp", "tar"):
        assert harness.tree_snapshot(fresh.p(name)) == want, f"{name} on a fresh mount"


def test_lookup_asks_only_small_non_checkpoint_objects(s3server, mounter):
    """§14: a listing carries no metadata, so a listed object that may be a link (1..4095
    bytes, not a checkpoint file) costs one HEAD at its first lookup, then none; a
    checkpoint file (*.distcp, .metadata, *.safetensors, ...) or a larger object costs
    none."""
    s = harness.S3Store(s3server, harness.unique_prefix("budget"))
    small = ["a.txt", "b.json", "c"]
    free = ["__0_0.distcp", ".metadata", "model.safetensors", "big.txt"]
    for n in small + free:
        s.put("d/" + n, b"x" * (5000 if n == "big.txt" else 10))
    m = mounter(s)
    before = m.stats()["head_requests"]
    for _ in range(2):
        names = os.listdir(m.p("d"))
        for n in names:
            os.lstat(m.p("d/" + n))
    assert sorted(names) == sorted(small + free)
    assert m.stats()["head_requests"] - before == len(small)
    assert not any(stat.S_ISLNK(os.lstat(m.p("d/" + n)).st_mode) for n in names)


def s3fs_mount(store, mnt, tmp_path):
    """A real s3fs (1.90) mount of store's prefix on s3rver at mnt."""
    pw = tmp_path / "s3fs.passwd"
    pw.write_text(f"{harness.S3_KEY}:{harness.S3_SECRET}\n")
    pw.chmod(0o600)
    os.makedirs(mnt, exist_ok=True)
    subprocess.run(["s3fs", f"{store.bucket}:/{store.prefix}", mnt, "-o",
                    f"url={store.server.endpoint},use_path_request_style,"
                    f"passwd_file={pw}"], check=True)
    deadline = time.monotonic() + 20
    while not os.path.ismount(mnt) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert os.path.ismount(mnt)


@pytest.mark.skipif(shutil.which("s3fs") is None, reason="s3fs is not installed")
def test_links_are_s3fs_compatible(s3server, mounter, tmp_path):
    """§14: a link made by s3fs 1.90 is a link on ckptfs, and one made by ckptfs is a link
    on s3fs: both ways, readlink and following."""
    s = harness.S3Store(s3server, harness.unique_prefix("s3fs"))
    s.put("keep", b"")  # the prefix exists for s3fs
    mnt = str(tmp_path / "s3fs")
    s3fs_mount(s, mnt, tmp_path)
    try:
        os.makedirs(os.path.join(mnt, "by_s3fs/step_2"))
        with open(os.path.join(mnt, "by_s3fs/step_2/w.bin"), "wb") as f:
            f.write(b"w2" * 500)
        os.symlink("step_2", os.path.join(mnt, "by_s3fs/latest"))
        # what s3fs 1.90 writes: the target as the body, mode S_IFLNK|0777 (41471)
        assert stored_link(s, "by_s3fs/latest") == "step_2"
        m = mounter(s)
        assert os.readlink(m.p("by_s3fs/latest")) == "step_2"
        assert stat.S_ISLNK(os.lstat(m.p("by_s3fs/latest")).st_mode)
        assert open(m.p("by_s3fs/latest/w.bin"), "rb").read() == b"w2" * 500
        make_links(m.p("by_ckptfs"))
        m.sync()
        check_links(os.path.join(mnt, "by_ckptfs"))
    finally:
        subprocess.run(["fusermount", "-u", mnt], check=False)
