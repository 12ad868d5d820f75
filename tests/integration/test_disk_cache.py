"""tests/integration/test_disk_cache.py - the persistent disk cache (--disk-cache-size,
issue #22) on a real mount: what a mount wrote or read is served from CACHE_DIR/disk-cache
by the next mount with the same cache directory, without asking the store for data; but
only for the version the store still has (a replaced object is fetched), only chunks whose
checksum holds (a flipped byte, or bytes a crash lost, are fetched again), within its bound,
never failing a read when its disk is full; and one mount at a time per cache folder.

The store is s3rver: a local-directory store's files are read in place (spliced from their
fds), so a mount on one keeps no disk cache; that is checked too.

Bytes fetched from the store are the daemon's own counter (get_bytes in the stats xattr,
every GET body byte, retries included), as test_request_budget.py counts requests.
"""

import glob
import os
import re
import subprocess
import threading
import time

import pytest

import harness
from harness import MiB

SIZE = "64M"  # --disk-cache-size of most tests: holds all of their data


@pytest.fixture
def store(s3server):
    """An S3 store (a prefix of the session's s3rver bucket) per test."""
    return harness.S3Store(s3server, harness.unique_prefix("dc"))


def files(seed, sizes):
    """{name: content} of deterministic files of the given sizes."""
    return {f"d/f{i}.bin": harness.data(n, seed * 100 + i) for i, n in enumerate(sizes)}


def read_all(m, want):
    for name, content in want.items():
        with open(m.p(name), "rb") as f:
            got = f.read()
        assert got == content, f"{name}: wrong content ({len(got)} bytes)"


def disk(m):
    return m.stats()["disk_cache"]


def remount(mounter, store, prev, *args):
    """A new mount of store on prev's cache directory."""
    return mounter(store, "--disk-cache-size", SIZE, *args, cache_dir=prev.cache_dir)


def data_files(m):
    return sorted(glob.glob(os.path.join(m.cache_dir, "disk-cache", "data", "*")))


def fill_by_reading(mounter, store, want, *args):
    """Put want on the store, read it through a mount (which keeps it), unmount."""
    store.put_many(list(want.items()))
    m = mounter(store, "-o", f"disk-cache-size={SIZE}", *args)  # the mount(8) spelling
    read_all(m, want)
    m.close()  # the background writer finishes before the daemon exits
    return m


def from_disk(d):
    """How many reads or opens the disk cache's files served: read in place by the daemon,
    or opened in passthrough (the kernel reads them)."""
    return d["in_place_reads"] + d["passthrough_opens"]


@pytest.mark.parametrize("passthrough", ["auto", "off"])
def test_restart_after_write_reads_nothing_from_store(store, mounter, passthrough):
    """Files saved through a mount are the cached copy of the version they uploaded: after an
    unmount and a mount again, loading them fetches no data byte from the store: the kernel
    reads them from the cache's files itself (passthrough, the default), or the daemon reads
    them in place (--passthrough=off)."""
    want = files(1, [3 * MiB + 12345, MiB, 777])
    m = mounter(store, "--disk-cache-size", SIZE, "--passthrough", passthrough)
    os.makedirs(m.p("d"))
    for name, content in want.items():
        with open(m.p(name), "wb") as f:
            f.write(content)
    m.sync()
    m.close()
    m2 = remount(mounter, store, m, "--passthrough", passthrough)
    read_all(m2, want)
    s = m2.stats()
    assert s["get_bytes"] == 0, s
    assert s["disk_cache"]["hit_bytes"] >= sum(len(c) for c in want.values()), s["disk_cache"]
    if passthrough == "auto":
        assert s["disk_cache"]["passthrough_opens"] == len(want), s["disk_cache"]
        assert s["disk_cache"]["in_place_reads"] == 0, s["disk_cache"]
    else:
        assert s["disk_cache"]["in_place_reads"] > 0, s["disk_cache"]  # spliced from its files
        assert s["disk_cache"]["passthrough_opens"] == 0, s["disk_cache"]


def test_restart_after_read_reads_nothing_from_store(store, mounter):
    """What a load fetched is kept in the background: the next mount's load of the same
    versions fetches no data byte from the store."""
    want = files(2, [5 * MiB + 3, 2 * MiB, 100])
    m = fill_by_reading(mounter, store, want)
    m2 = remount(mounter, store, m)
    read_all(m2, want)
    s = m2.stats()
    assert s["get_bytes"] == 0, s
    assert s["disk_cache"]["stored_bytes"] == 0  # nothing new to keep
    out = subprocess.run([harness.admin_bin(), "stats", m2.path], capture_output=True,
                         text=True, check=True).stdout
    total = sum(len(c) for c in want.values())
    assert re.search(r"^disk cache\n  held +%s" % re.escape(fmt_size(total)), out, re.M), out
    assert re.search(r"^  hits +\d+ reads, %s" % re.escape(fmt_size(total)), out, re.M), out


def fmt_size(b):
    """ckptfs-admin's spelling of a byte count."""
    return f"{b / MiB:.2f} MiB ({b} B)"


def test_replaced_object_is_fetched_not_served(store, mounter):
    """An object replaced on the store (same size, new content) after the unmount: the
    next mount reads the new content from the store, never the cached old one."""
    old = files(3, [2 * MiB + 5])
    m = fill_by_reading(mounter, store, old)
    new = {k: harness.data(len(v), 99) for k, v in old.items()}
    store.put_many(list(new.items()))
    m2 = remount(mounter, store, m)
    read_all(m2, new)
    s = m2.stats()
    # (get_bytes may lag the last few bytes a reader already has: counted after publishing)
    assert s["get_bytes"] >= 2 * MiB and s["disk_cache"]["hit_bytes"] == 0, s


def test_flipped_byte_is_detected_and_refetched(store, mounter):
    """A byte flipped in a cache data file: its chunk fails its checksum, is dropped and
    fetched again; the reader gets the right content."""
    want = files(4, [3 * MiB])
    m = fill_by_reading(mounter, store, want)
    paths = data_files(m)
    assert paths, "nothing kept in the disk cache"
    for p in paths:
        with open(p, "r+b") as f:
            f.seek(MiB + 4321)
            b = f.read(1)
            f.seek(MiB + 4321)
            f.write(bytes([b[0] ^ 0x5A]))
    m2 = remount(mounter, store, m)
    read_all(m2, want)
    s = m2.stats()
    assert s["disk_cache"]["checksum_failures"] >= 1, s["disk_cache"]
    assert 0 < s["get_bytes"] < 3 * MiB, s  # that chunk, not the whole file


def flip(path, at):
    """Flip the byte at offset at of path (its mtime moves)."""
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x5A]))


def forget_pages(path):
    """Drop path's clean pages from the page cache (a FUSE file's too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.mark.parametrize("passthrough", ["auto", "off"])
def test_checked_chunk_is_checked_again_once_out_of_page_cache(store, mounter, passthrough):
    """A chunk read in place (or opened in passthrough) was checked while its bytes came into
    the page cache; once they left it, the disk may give back other bytes: they are checked
    again (here a byte flipped on disk with the file's mtime kept, so only the page cache
    tells) by the next read or open, and the reader gets the right content from the store."""
    want = files(9, [3 * MiB])
    m = fill_by_reading(mounter, store, want)
    m2 = remount(mounter, store, m, "--passthrough", passthrough)
    read_all(m2, want)
    key = "passthrough_opens" if passthrough == "auto" else "in_place_reads"
    assert disk(m2)[key] > 0
    (p,) = data_files(m)
    st = os.stat(p)
    flip(p, MiB + 99)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    forget_pages(p)
    forget_pages(m2.p("d/f0.bin"))
    read_all(m2, want)
    s = m2.stats()
    assert s["disk_cache"]["checksum_failures"] == 1, s["disk_cache"]
    assert 0 < s["get_bytes"] < 3 * MiB, s


def test_data_file_written_while_mounted_is_checked_again(store, mounter):
    """A cache data file written by someone else while the mount reads it in place (its mtime
    moves; the new bytes are in the page cache): its chunks are checked again before the next
    reply, so a flipped byte is detected and fetched, never served."""
    want = files(10, [3 * MiB])
    m = fill_by_reading(mounter, store, want)
    m2 = remount(mounter, store, m)
    read_all(m2, want)
    (p,) = data_files(m)
    flip(p, 2 * MiB + 7)
    forget_pages(m2.p("d/f0.bin"))  # the mount's own pages: the next read asks the daemon
    read_all(m2, want)
    s = m2.stats()
    assert s["disk_cache"]["checksum_failures"] == 1, s["disk_cache"]
    assert 0 < s["get_bytes"] < 3 * MiB, s


def test_partial_read_checks_only_the_chunks_it_needs(store, mounter):
    """A read of a few bytes of a large cached file reads in place only the chunks around
    them, not the whole file."""
    want = files(11, [16 * MiB])
    m = fill_by_reading(mounter, store, want)
    m2 = remount(mounter, store, m)
    with open(m2.p("d/f0.bin"), "rb") as f:
        got = os.pread(f.fileno(), 100, 9 * MiB + 5)
    assert got == want["d/f0.bin"][9 * MiB + 5:9 * MiB + 105]
    d = disk(m2)  # 16 MiB, not one checkpoint item: not checked whole for passthrough
    assert d["in_place_reads"] > 0 and 0 < d["hit_bytes"] <= 3 * MiB, d
    assert d["passthrough_opens"] == 0, d


def test_recovered_staged_file_is_cached_as_the_version_its_upload_made(store, mounter,
                                                                         faultproxy):
    """kill -9 while a staged file's upload is held up; the next mount on the same cache dir
    uploads it from the journal and keeps it as the copy of the version that upload made: a
    mount after that reads it without a data byte from the store, and once the object is
    replaced on the store, reads the new content, not the kept copy."""
    name, content = "d/rec.bin", harness.data(2 * MiB + 3, 1201)

    def hold_puts(req):
        if req.method == "PUT":
            time.sleep(3)
        return "pass"

    slow = faultproxy(store.server.port, policy=hold_puts)
    m = mounter(store, "--disk-cache-size", SIZE, "--fsync=staged", endpoint=slow.endpoint)
    os.makedirs(m.p("d"))
    with open(m.p(name), "wb") as f:
        f.write(content)
    assert m.stats()["write"]["pending_files"] > 0  # staged, its upload held up
    m.kill9()
    m2 = remount(mounter, store, m, "--fsync=staged")
    m2.sync()
    assert m2.stats()["write"]["recovered_files"] > 0
    m2.close()  # the staged file is retired (adopted) by the time the daemon exits
    m3 = remount(mounter, store, m)
    read_all(m3, {name: content})
    s = m3.stats()
    assert s["get_bytes"] == 0 and from_disk(s["disk_cache"]) > 0, s
    m3.close()
    new = harness.data(len(content), 1202)
    store.put_many([(name, new)])
    m4 = remount(mounter, store, m)
    read_all(m4, {name: new})
    assert m4.stats()["disk_cache"]["hit_bytes"] == 0


def test_crash_during_fill_serves_only_verified_chunks(store, mounter):
    """kill -9 while the cache fills, then the second half of each data file zeroed (what a
    power cut could lose of writes the catalogue already lists): the next mount serves only
    chunks whose checksum holds and fetches the rest; every byte read is right."""
    want = files(5, [12 * MiB, 6 * MiB + 17])
    store.put_many(list(want.items()))
    m = mounter(store, "--disk-cache-size", SIZE)
    read_all(m, want)
    m.kill9()
    for p in data_files(m):
        size = os.path.getsize(p)
        with open(p, "r+b") as f:
            f.seek(size // 2)
            f.write(bytes(size - size // 2))
    m2 = remount(mounter, store, m)
    read_all(m2, want)
    s = m2.stats()
    assert s["get_bytes"] > 0, s  # the lost halves came from the store
    m2.close()
    m3 = remount(mounter, store, m)
    read_all(m3, want)
    assert m3.stats()["get_bytes"] == 0  # and were kept again


def test_bound_holds_under_concurrent_readers(store, mounter):
    """8 readers at once through a 4 MiB disk cache: it never holds more than its size plus
    the chunk being written (checked while they read and after), evicting the least recently
    used; every byte read is right."""
    want = files(6, [3 * MiB] * 8)
    store.put_many(list(want.items()))
    m = mounter(store, "--disk-cache-size", "4M")
    peak = [0]
    done = threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], disk(m)["held_bytes"])

    w = threading.Thread(target=watch)
    w.start()
    errors = []

    def reader(name):
        try:
            read_all(m, {name: want[name]})
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=reader, args=(n,)) for n in want]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    done.set()
    w.join()
    assert not errors, errors
    d = disk(m)
    m.close()
    assert peak[0] <= 4 * MiB + MiB, (peak[0], d)
    assert d["evictions"] > 0, d
    on_disk = sum(os.stat(p).st_blocks * 512 for p in data_files(m))
    assert on_disk <= 4 * MiB + MiB + 64 * 1024, on_disk


@pytest.fixture
def tiny_dir(tmp_path):
    """A 3 MiB tmpfs (unmounted after the test)."""
    with harness.tmpfs(str(tmp_path / "tiny"), "3m") as d:
        yield d


def test_full_cache_disk_never_fails_a_read(tiny_dir, store, mounter):
    """The cache folder on a 3 MiB file system, the cache allowed 64 MiB, and that file
    system then filled to the last byte by another file: keeping fails (logged), reads do
    not, and give the right bytes."""
    want = files(7, [2 * MiB, 2 * MiB, 2 * MiB])
    store.put_many(list(want.items()))
    m = mounter(store, "--disk-cache-size", SIZE, "--read-only", cache_dir=tiny_dir)
    m.stats()  # answered: its LMDB files are made (the kernel mount comes before them)
    junk = harness.fill_disk(tiny_dir)
    try:
        read_all(m, want)
        read_all(m, want)
        d = disk(m)
    finally:
        os.unlink(junk)
    m.close()
    assert d["put_failures"] > 0 and d["held_bytes"] == 0, d
    assert "disk cache: cannot keep" in m.log()


def test_min_free_leaves_that_much_of_its_disk_free(tiny_dir, store, mounter):
    """--disk-cache-min-free 60 on a 3 MiB file system: the cache keeps what fits above 60%
    free and no more (reads of everything still right)."""
    want = files(12, [MiB, MiB, MiB])
    store.put_many(list(want.items()))
    m = mounter(store, "--disk-cache-size", SIZE, "--disk-cache-min-free", "60", "--read-only",
                cache_dir=tiny_dir)
    read_all(m, want)
    d = disk(m)
    m.close()
    fs = os.statvfs(tiny_dir)
    assert fs.f_bavail >= 0.6 * fs.f_blocks - 64 * 1024 / fs.f_frsize, (fs, d)  # LMDB's pages
    assert d["held_bytes"] < 2 * MiB, d


def test_second_mount_on_same_cache_dir_refuses(store, mounter):
    """Two mounts cannot share a disk cache: the second exits with an error naming the
    folder's user."""
    m = mounter(store, "--disk-cache-size", SIZE)
    m.stats()  # answered: the daemon has opened its disk cache (the kernel mount comes first)
    with pytest.raises(harness.HarnessError) as e:
        mounter(store, "--disk-cache-size", SIZE, "--read-only", cache_dir=m.cache_dir)
    assert "disk-cache" in str(e.value) and str(m.proc.pid) in str(e.value), str(e.value)


def test_local_directory_store_keeps_no_disk_cache(tmp_path, mounter):
    """A local-directory store is read in place: the option is accepted, nothing is kept
    (its log says why), reads are right."""
    store = harness.DirStore(str(tmp_path / "store"))
    want = files(8, [MiB + 1])
    store.put_many(list(want.items()))
    m = mounter(store, "--disk-cache-size", SIZE)
    read_all(m, want)
    assert disk(m)["enabled"] is False
    m.close()
    assert "disk cache not used" in m.log()
