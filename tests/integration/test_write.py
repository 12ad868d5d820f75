"""The write path through a mount, on both stores (s3rver bucket prefix and local dir).

Each test names the section of docs/semantics.md it checks. Data is verified byte by
byte on the store itself (boto3 / the directory), not only through the mount.
"""

import errno
import hashlib
import mmap
import multiprocessing
import os
import random
import threading
import time

import pytest

import harness
from harness import MiB

PART = 5 * MiB  # the smallest part size S3 allows: multipart with little data
BOUND = 120


def timed(fn, what, bound=BOUND):
    return harness.call_with_timeout(fn, bound * harness.slow_factor(), what)


def write_file(path, chunks):
    """chunks: [(offset, bytes)] written in that order with pwrite on one fd."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for off, b in chunks:
            assert os.pwrite(fd, b, off) == len(b)
    finally:
        os.close(fd)


def s3rver_uploads(store):
    """Multipart uploads in progress below an s3rver store's prefix: [(key, upload id)],
    read from s3rver's data directory (it answers NotImplemented to
    ListMultipartUploads). s3rver keeps each upload in <data>/<bucket>/._S3rver_uploads/
    <upload id>/ with its key in the file "key" until the upload completes."""
    root = os.path.join(store.server.datadir, store.bucket, "._S3rver_uploads")
    assert os.path.isdir(os.path.join(store.server.datadir, store.bucket)), "not s3rver's layout"
    want = store.prefix + "/" if store.prefix else ""
    out = []
    for upload_id in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        try:
            with open(os.path.join(root, upload_id, "key")) as f:
                key = f.read()
        except FileNotFoundError:
            continue  # completed meanwhile
        if key.startswith(want):
            out.append((key, upload_id))
    return out


def uploads_of(store):
    """Uploads in progress on the store: the server's list, or s3rver's on-disk state."""
    left = store.uploads()
    if left is None and isinstance(store, harness.S3Store) and isinstance(store.server, harness.S3Server):
        left = s3rver_uploads(store)
    assert left is not None, f"cannot list the uploads of {store.url}"
    return left


def no_uploads_left(store, aborted=False):
    """No multipart upload of the store is left in progress. aborted: the uploads were
    ended by AbortMultipartUpload, which s3rver does not have (405 MethodNotAllowed: its
    uploads stay on disk), so there the check is skipped, saying so."""
    if aborted and isinstance(store, harness.S3Store) and isinstance(store.server, harness.S3Server):
        pytest.skip("s3rver cannot abort a multipart upload (405 MethodNotAllowed): "
                    "checked on radosgw and the local directory")
    left = uploads_of(store)
    assert not left, f"multipart uploads left on the store: {left}"


# ----------------------------------------------------------------- round trips (§1, §2)


def test_small_file_round_trip(wstore, mounter):
    """§1 §2: close stages, sync publishes; the store has the exact bytes."""
    mnt = mounter(wstore, "--part-size", "5M")
    os.makedirs(mnt.p("d/e"), exist_ok=True)
    want = harness.data(123457, seed=1)
    with open(mnt.p("d/e/small.bin"), "wb") as f:
        f.write(want)
    assert os.stat(mnt.p("d/e/small.bin")).st_size == len(want)
    assert harness.read_file(mnt.p("d/e/small.bin")) == want
    mnt.sync()
    assert wstore.get("d/e/small.bin") == want
    st = mnt.stats()["write"]
    assert st["files_published"] >= 1 and st["pending_files"] == 0, st
    assert st["put_requests"] >= 1 and st["part_requests"] == 0, st
    no_uploads_left(wstore)


def test_empty_file(wstore, mounter):
    mnt = mounter(wstore)
    open(mnt.p("empty"), "wb").close()
    mnt.sync()
    assert wstore.get("empty") == b""
    assert os.stat(mnt.p("empty")).st_size == 0


def test_reverse_order_1mib_writes(wstore, mounter):
    """§1: writes in any order; a multipart upload of the result."""
    size = 3 * PART + 3 * MiB + 17
    want = harness.data(size, seed=2)
    mnt = mounter(wstore, "--part-size", "5M")
    offs = list(range(0, size, MiB))[::-1]
    write_file(mnt.p("rev.bin"), [(o, want[o:o + MiB]) for o in offs])
    mnt.sync()
    assert wstore.get("rev.bin") == want
    assert harness.read_file(mnt.p("rev.bin")) == want
    st = mnt.stats()["write"]
    assert st["part_requests"] >= 4 and st["complete_requests"] >= 1, st
    no_uploads_left(wstore)


def test_random_4k_blocks_in_random_order(wstore, mounter):
    """§1: random 4 KiB blocks in random order, the whole file covered at the end."""
    size = 2 * PART + 12345
    want = harness.data(size, seed=3)
    offs = list(range(0, size, 4096))
    random.Random(3).shuffle(offs)
    mnt = mounter(wstore, "--part-size", "5M")
    write_file(mnt.p("rnd.bin"), [(o, want[o:o + 4096]) for o in offs])
    mnt.sync()
    assert wstore.get("rnd.bin") == want
    no_uploads_left(wstore)


def _write_half(path, seed, size, half):
    want = harness.data(size, seed=seed)
    fd = os.open(path, os.O_WRONLY)
    try:
        lo, hi = (0, size // 2) if half == 0 else (size // 2, size)
        for off in range(lo, hi, 256 * 1024):
            end = min(off + 256 * 1024, hi)
            os.pwrite(fd, want[off:end], off)
    finally:
        os.close(fd)


def _appears_within(store, relpath, seconds):
    """store has relpath within seconds (uploads of sealed files start at once)."""
    deadline = time.monotonic() + seconds * harness.slow_factor()
    while time.monotonic() < deadline:
        if store.get(relpath) is not None:
            return True
        time.sleep(0.05)
    return False


def test_only_the_openers_close_seals(wstore, mounter):
    """§2: FUSE sends a flush for every close(2), also a forked child's close of a
    descriptor it inherited (a DataLoader worker exiting mid-save). Only a close by
    the process that opened the file seals it; any thread of that process will do."""
    mnt = mounter(wstore)
    first, rest = harness.data(300000, seed=7), harness.data(200000, seed=8)
    fd = os.open(mnt.p("forked.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, first)
        pid = os.fork()
        if pid == 0:
            os._exit(0)  # the exit closes the inherited descriptor: a flush from the child
        assert os.waitpid(pid, 0)[1] == 0
        assert not _appears_within(wstore, "forked.bin", 1.5), \
            "a forked child's close published a half-written file"
        os.write(fd, rest)
    finally:
        os.close(fd)
    mnt.sync()
    assert wstore.get("forked.bin") == first + rest
    assert mnt.stats()["write"]["put_requests"] == 1

    # Another thread of the opener closes a duplicate: that is the opener's close
    # (FUSE names the thread; the mount maps it to its process).
    fd = os.open(mnt.p("threaded.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, first)
        dup = os.dup(fd)
        t = threading.Thread(target=os.close, args=(dup,))
        t.start()
        t.join()
        assert _appears_within(wstore, "threaded.bin", 30), "a thread's close did not seal"
    finally:
        os.close(fd)
    mnt.sync()
    assert wstore.get("threaded.bin") == first


def test_two_processes_write_ranges_of_one_file(wstore, mounter):
    """§1: two processes write different ranges of one file at the same time."""
    size = 2 * PART + 777
    mnt = mounter(wstore, "--part-size", "5M")
    path = mnt.p("shared.bin")
    open(path, "wb").close()
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_write_half, args=(path, 4, size, h)) for h in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60 * harness.slow_factor())
        assert p.exitcode == 0
    mnt.sync()
    assert wstore.get("shared.bin") == harness.data(size, seed=4)


@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_sizes_around_the_part_size(wstore, mounter, delta):
    """§1: one PUT up to the part size, multipart above it."""
    size = PART + delta
    want = harness.data(size, seed=5 + delta)
    mnt = mounter(wstore, "--part-size", "5M")
    with open(mnt.p("edge.bin"), "wb") as f:
        f.write(want)
    mnt.sync()
    assert wstore.get("edge.bin") == want
    st = mnt.stats()["write"]
    if size <= PART:
        assert st["put_requests"] >= 1 and st["mpu_begin_requests"] == 0, st
    else:
        assert st["mpu_begin_requests"] >= 1 and st["part_requests"] >= 2, st
    no_uploads_left(wstore)


def test_1gib_file(wstore, mounter):
    """§1: a 1 GiB file written sequentially arrives byte-exact (hashed, not held)."""
    size = 1 << 30
    mnt = mounter(wstore)
    h = hashlib.sha256()
    block = harness.data(8 * MiB, seed=6)
    with open(mnt.p("big.bin"), "wb") as f:
        for i in range(size // len(block)):
            b = block[i % 7:] + block[:i % 7]  # every block differs a little
            h.update(b)
            f.write(b)
    mnt.sync(timeout=600)
    got = hashlib.sha256()
    if wstore.kind == "s3":
        body = wstore.s3.get_object(Bucket=wstore.bucket, Key=wstore.key("big.bin"))["Body"]
        for chunk in iter(lambda: body.read(8 * MiB), b""):
            got.update(chunk)
    else:
        with open(os.path.join(wstore.root, "big.bin"), "rb") as f:
            for chunk in iter(lambda: f.read(8 * MiB), b""):
                got.update(chunk)
    assert got.hexdigest() == h.hexdigest()
    no_uploads_left(wstore)


# ----------------------------------------------------------------- changing what exists (§5)


def test_overwrite_and_truncate_existing_objects(wstore, mounter):
    """§5: open an existing object for writing (its bytes are staged first), change a
    range, truncate another, replace a third with O_TRUNC."""
    a = harness.data(3 * MiB, seed=7)
    wstore.put("a.bin", a)
    wstore.put("b.bin", a)
    wstore.put("c.bin", a)
    mnt = mounter(wstore, "--part-size", "5M")
    patch = b"X" * 1000
    fd = os.open(mnt.p("a.bin"), os.O_RDWR)
    os.pwrite(fd, patch, MiB)
    os.close(fd)
    os.truncate(mnt.p("b.bin"), 1000)
    with open(mnt.p("c.bin"), "wb") as f:
        f.write(b"new")
    mnt.sync()
    assert wstore.get("a.bin") == a[:MiB] + patch + a[MiB + 1000:]
    assert wstore.get("b.bin") == a[:1000]
    assert wstore.get("c.bin") == b"new"
    assert harness.read_file(mnt.p("a.bin")) == wstore.get("a.bin")


def test_rename_onto_an_existing_name_replaces_it(wstore, mounter):
    """§6: rename of a staged file is free; over an existing object it replaces it."""
    wstore.put("dst.bin", b"old")
    mnt = mounter(wstore)
    with open(mnt.p("src.tmp"), "wb") as f:
        f.write(b"new content")
    os.rename(mnt.p("src.tmp"), mnt.p("dst.bin"))
    assert not os.path.exists(mnt.p("src.tmp"))
    assert harness.read_file(mnt.p("dst.bin")) == b"new content"
    mnt.sync()
    assert wstore.get("dst.bin") == b"new content"
    assert wstore.get("src.tmp") is None
    st = mnt.stats()["write"]
    assert st["copy_requests"] == 0, st  # staged: only the final name was uploaded


def test_rename_of_a_stored_object_copies_it(wstore, mounter):
    """§6: an object already on the store is renamed server-side."""
    wstore.put("x/one.bin", b"stored bytes")
    mnt = mounter(wstore)
    os.rename(mnt.p("x/one.bin"), mnt.p("x/two.bin"))
    assert harness.read_file(mnt.p("x/two.bin")) == b"stored bytes"
    assert wstore.get("x/one.bin") is None
    assert wstore.get("x/two.bin") == b"stored bytes"
    assert sorted(os.listdir(mnt.p("x"))) == ["two.bin"]


def test_unlink_during_upload_aborts_it(wstore, mounter):
    """§7: a file unlinked while its multipart upload runs leaves nothing behind."""
    size = 6 * PART
    mnt = mounter(wstore, "--part-size", "5M")
    block = harness.data(PART, seed=8)
    with open(mnt.p("gone.bin"), "wb") as f:
        for _ in range(size // PART):
            f.write(block)
    os.unlink(mnt.p("gone.bin"))
    assert not os.path.exists(mnt.p("gone.bin"))
    mnt.sync()
    deadline = time.monotonic() + 30
    # s3rver cannot abort (no_uploads_left): there only the object is waited for
    waits_uploads = not (isinstance(wstore, harness.S3Store) and isinstance(wstore.server, harness.S3Server))
    while ((waits_uploads and uploads_of(wstore)) or wstore.get("gone.bin") is not None) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert wstore.get("gone.bin") is None
    no_uploads_left(wstore, aborted=True)


def test_directories_mkdir_rmdir_and_modes(wstore, mounter):
    """§5: mkdir/rmdir; default modes 0644/0755; chmod and utime succeed (what they
    store: test_attrs.py, §13)."""
    mnt = mounter(wstore)
    os.mkdir(mnt.p("newdir"))
    st = os.stat(mnt.p("newdir"))
    assert oct(st.st_mode & 0o777) == oct(0o755)
    assert "newdir" in os.listdir(mnt.p())
    with pytest.raises(FileExistsError):
        os.mkdir(mnt.p("newdir"))
    with open(mnt.p("newdir/f"), "wb") as f:
        f.write(b"1")
    assert oct(os.stat(mnt.p("newdir/f")).st_mode & 0o777) == oct(0o644)
    os.chmod(mnt.p("newdir/f"), 0o600)
    os.utime(mnt.p("newdir/f"), (1, 1))
    assert harness.errno_of(lambda: os.rmdir(mnt.p("newdir"))) == errno.ENOTEMPTY
    os.unlink(mnt.p("newdir/f"))
    os.rmdir(mnt.p("newdir"))
    assert not os.path.exists(mnt.p("newdir"))
    assert "newdir" not in os.listdir(mnt.p())


def test_a_renamed_or_removed_directory_leaves_no_stale_names(mounter, tmp_path):
    """§6: after a directory rename the files show under the new name and not the old
    one; after rmdir and mkdir of the same name, the old entries are gone (the metadata
    cache forgot everything below both names). A local store (S3: test_rename_dir.py)."""
    store = harness.DirStore(str(tmp_path / "store"))
    mnt = mounter(store, "--attr-timeout", "30")  # stale entries would outlive the test
    os.mkdir(mnt.p("b"))
    assert os.listdir(mnt.p("b")) == []  # b is known to be empty
    os.rmdir(mnt.p("b"))
    os.mkdir(mnt.p("a"))
    with open(mnt.p("a/x"), "wb") as f:
        f.write(b"hello")
    mnt.sync("a")
    assert os.stat(mnt.p("a/x")).st_size == 5  # a/x cached as present
    os.rename(mnt.p("a"), mnt.p("b"))
    assert os.stat(mnt.p("b/x")).st_size == 5, "a moved file is missing under the new name"
    with open(mnt.p("b/x"), "rb") as f:
        assert f.read() == b"hello"
    os.mkdir(mnt.p("a"))
    assert harness.errno_of(lambda: os.stat(mnt.p("a/x"))) == errno.ENOENT, \
        "a moved file still shows under the old name"
    assert os.listdir(mnt.p("a")) == []


def test_a_directory_renamed_onto_an_empty_one_replaces_it(wstore, mounter):
    """§6, rename(2): a directory renamed onto an existing empty directory replaces it;
    onto one with something in it, ENOTEMPTY."""
    mnt = mounter(wstore)
    os.mkdir(mnt.p("src"))
    os.mkdir(mnt.p("empty"))
    if wstore.kind == "dir":  # a store that renames directories: with a file in it
        with open(mnt.p("src/x"), "wb") as f:
            f.write(b"moved")
        mnt.sync("src")
    os.rename(mnt.p("src"), mnt.p("empty"))
    assert not os.path.exists(mnt.p("src"))
    assert os.path.isdir(mnt.p("empty"))
    time.sleep(1.2)  # past the attribute timeout: the store says so too
    assert not os.path.exists(mnt.p("src")), "the old name came back from the store"
    assert os.path.isdir(mnt.p("empty"))
    with open(mnt.p("empty/y"), "wb") as f:
        f.write(b"new")
    os.mkdir(mnt.p("src"))
    assert harness.errno_of(lambda: os.rename(mnt.p("src"), mnt.p("empty"))) == errno.ENOTEMPTY
    mnt.sync()
    assert wstore.get("empty/y") == b"new"
    if wstore.kind == "dir":
        assert wstore.get("empty/x") == b"moved"


def test_names_the_store_cannot_hold_fail_at_create(wstore, mounter):
    """§6: a name the store cannot hold fails at create with ENAMETOOLONG (a local
    directory: components over 255 bytes; S3: keys over 1024 bytes), not at every upload
    after it; statfs reports the store's longest name."""
    mnt = mounter(wstore)
    name_max = os.statvfs(mnt.p()).f_namemax
    assert name_max == (255 if wstore.kind == "dir" else 1024), name_max
    too_long = "n" * (name_max + 1)
    assert harness.errno_of(lambda: open(mnt.p(too_long), "wb")) == errno.ENAMETOOLONG
    with open(mnt.p("ok"), "wb") as f:
        f.write(b"1")
    assert harness.errno_of(lambda: os.rename(mnt.p("ok"), mnt.p(too_long))) == errno.ENAMETOOLONG
    mnt.sync()  # nothing left failing to upload


def test_a_name_with_a_control_character_does_not_break_its_directory(wstore, mounter):
    """§5: S3 takes any UTF-8 key; a listing of a directory holding a name with a control
    character still works (keys are asked URL-encoded: raw, such a key is not XML 1.0)."""
    if type(wstore) is harness.S3Store:  # s3rver (radosgw's store is a subclass)
        # Checked by hand: s3rver ignores encoding-type=url and writes the raw byte into
        # its XML, which no XML parser takes (boto3's listing fails the same way).
        pytest.skip("s3rver cannot list such a key for any client")
    mnt = mounter(wstore)
    os.mkdir(mnt.p("ctl"))
    for name in ("a\x01b", "plain"):
        with open(mnt.p("ctl/" + name), "wb") as f:
            f.write(name.encode())
    mnt.sync()
    fresh = mounter(wstore)  # lists the store, not this mount's cache
    assert sorted(os.listdir(fresh.p("ctl"))) == ["a\x01b", "plain"]
    with open(fresh.p("ctl/a\x01b"), "rb") as f:
        assert f.read() == b"a\x01b"


# ----------------------------------------------------------------- visibility (§2)


def test_read_your_writes_while_writing(wstore, mounter):
    """§2 §11: a file being written is listed and readable with its current size at once."""
    mnt = mounter(wstore, "--part-size", "5M")
    want = harness.data(3 * MiB, seed=9)
    fd = os.open(mnt.p("live.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.write(fd, want[:MiB])
        assert "live.bin" in os.listdir(mnt.p())
        assert os.stat(mnt.p("live.bin")).st_size == MiB
        with open(mnt.p("live.bin"), "rb") as r:
            assert r.read() == want[:MiB]
        os.write(fd, want[MiB:])
        with open(mnt.p("live.bin"), "rb") as r:
            assert r.read() == want
    finally:
        os.close(fd)


def test_a_reader_sees_rewrites_through_a_write_only_descriptor(wstore, mounter):
    """§2: bytes rewritten through a write-only descriptor (which bypasses the kernel's
    page cache) are what a reader that already read the old bytes reads next."""
    mnt = mounter(wstore, "--part-size", "5M")
    old, new = harness.data(MiB, seed=10), harness.data(64 * 1024, seed=11)
    fd = os.open(mnt.p("rewritten.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.write(fd, old)
        r = os.open(mnt.p("rewritten.bin"), os.O_RDONLY)
        try:
            assert os.pread(r, MiB, 0) == old
            os.pwrite(fd, new, 4096)
            assert os.pread(r, MiB, 0) == old[:4096] + new + old[4096 + len(new):]
        finally:
            os.close(r)
    finally:
        os.close(fd)
    mnt.sync()
    assert wstore.get("rewritten.bin") == old[:4096] + new + old[4096 + len(new):]


def test_shared_mmap_writes_of_a_new_file(wstore, mounter):
    """§1: a file created read-write can be written through a shared mapping (numpy's
    memmap mode w+ does this); the store gets the mapped bytes."""
    mnt = mounter(wstore)
    want = harness.data(2 * MiB, seed=12)
    fd = os.open(mnt.p("mapped.bin"), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, len(want))
        m = mmap.mmap(fd, len(want), mmap.MAP_SHARED)
        m[:] = want
        m.flush()
        m.close()
    finally:
        os.close(fd)
    mnt.sync()
    assert wstore.get("mapped.bin") == want


def test_poller_never_sees_a_partial_object(wstore, mounter):
    """§1: while large files are written, every object that appears on the store is
    complete (its final size and bytes)."""
    if wstore.shows_partial_objects:
        pytest.skip("s3rver shows objects while it receives them, whatever the client does")
    files = {f"p/f{i}.bin": harness.data(2 * PART + i * 1000, seed=10 + i) for i in range(4)}
    mnt = mounter(wstore, "--part-size", "5M")
    bad, seen, stop = [], set(), threading.Event()

    def poll():
        while not stop.is_set():
            for k in wstore.keys("p"):
                if k in seen or k not in files:
                    continue
                b = wstore.get(k)
                if b is None:
                    continue
                if b != files[k]:
                    bad.append((k, len(b)))
                seen.add(k)
            time.sleep(0.02)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    try:
        os.mkdir(mnt.p("p"))
        for name, want in files.items():
            with open(mnt.p(name), "wb") as f:
                for off in range(0, len(want), MiB):
                    f.write(want[off:off + MiB])
        mnt.sync()
    finally:
        stop.set()
        t.join(10)
    assert not bad, f"partial objects seen on the store: {bad}"
    for name, want in files.items():
        assert wstore.get(name) == want


# ----------------------------------------------------------------- tools and limits (§8)


def test_fio_random_writes_verify(wstore, mounter, tmp_path):
    """§1: fio's random 4 KiB writes with crc32c verification: no mismatch, through the
    mount and (after sync) on the store."""
    mnt = mounter(wstore, "--part-size", "5M")
    job = ["fio", "--name=rw", f"--directory={mnt.p()}", "--filename=fio.dat", "--size=24M",
           "--bs=4k", "--rw=randwrite", "--ioengine=psync", "--verify=crc32c",
           "--do_verify=1", "--verify_fatal=1", "--randrepeat=1", "--output-format=json"]
    import json
    import subprocess
    r = subprocess.run(job, capture_output=True, text=True, cwd=tmp_path,  # verify state file
                       timeout=300 * harness.slow_factor())
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads(r.stdout[r.stdout.index("{"):])
    assert out["jobs"][0]["error"] == 0, out["jobs"][0]
    assert out["jobs"][0]["write"]["io_bytes"] >= 24 * MiB
    mnt.sync()
    assert wstore.get("fio.dat") == harness.read_file(mnt.p("fio.dat"))


def test_writers_wait_for_staging_space(wstore, mounter, faultproxy):
    """§8: with --stage-size smaller than what is written, writers wait for uploads to
    free space instead of failing (uploads are slowed down so that the writer is faster)."""
    args = ["--stage-size", "64M", "--part-size", "5M", "--upload-workers", "2"]
    if wstore.kind == "s3":
        def slow(req):
            time.sleep(0.2)
            return "pass"
        proxy = faultproxy(wstore.server.port, policy=slow)
        mnt = mounter(wstore, *args, endpoint=proxy.endpoint)
    else:
        mnt = mounter(wstore, *args)
    files = {f"b/f{i}.bin": harness.data(30 * MiB, seed=40 + i) for i in range(4)}  # 120 MiB
    os.mkdir(mnt.p("b"))
    for k, b in files.items():
        with open(mnt.p(k), "wb") as f:
            for off in range(0, len(b), MiB):
                f.write(b[off:off + MiB])
    mnt.sync()
    for k, b in files.items():
        assert wstore.get(k) == b
    st = mnt.stats()["write"]
    if wstore.kind == "s3":  # the local store's uploads are as fast as the writes
        assert st["budget_waits"] >= 1, st
