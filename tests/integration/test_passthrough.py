"""tests/integration/test_passthrough.py - FUSE passthrough of the disk cache's files
(--passthrough=auto, issue #22) on a real mount and kernel: a file the disk cache holds whole
is checked at open and the kernel reads it from the cache's data file itself.

The kernel keeps one mode per inode while it is open: every open of a file open in
passthrough must name the same backing file, and none may be in passthrough while another
reads through the page cache; a wrong reply fails the open with EIO. These tests open one
file many ways at once and check that no open fails and every byte is right. They need
Linux 6.9+ with CONFIG_FUSE_PASSTHROUGH and root (the backing-file ioctl needs
CAP_SYS_ADMIN); elsewhere they are skipped, and reads go through the daemon.
"""
import errno
import os
import signal
import threading
import time

import pytest

import harness
from harness import MiB

SIZE = "64M"


@pytest.fixture
def store(s3server):
    """An S3 store (a prefix of the session's s3rver bucket) per test."""
    return harness.S3Store(s3server, harness.unique_prefix("pt"))


def cached_mount(store, mounter, want):
    """want saved through a mount (kept as its disk cache's copy), then a new mount on the
    same cache dir: the restart case. Skips if this kernel gives no passthrough."""
    m = mounter(store, "--disk-cache-size", SIZE)
    for name, content in want.items():
        os.makedirs(os.path.dirname(m.p(name)), exist_ok=True)
        with open(m.p(name), "wb") as f:
            f.write(content)
    m.sync()
    m.close()
    m2 = mounter(store, "--disk-cache-size", SIZE, cache_dir=m.cache_dir)
    name = next(iter(want))
    with open(m2.p(name), "rb") as f:
        assert f.read() == want[name]
    if m2.stats()["disk_cache"]["passthrough_opens"] == 0:
        pytest.skip("no FUSE passthrough here (Linux 6.9+, CAP_SYS_ADMIN): " +
                    harness.tail(m2.logpath, 5))
    return m2


def read_fd(fd):
    out = []
    while True:
        b = os.read(fd, MiB)
        if not b:
            return b"".join(out)
        out.append(b)


def test_overlapping_opens_of_a_file_all_succeed(store, mounter):
    """Twelve threads open three cached files at once (four opens each, overlapping): all
    share their file's one backing file, none fails, every byte is right."""
    want = {f"d/f{i}.bin": harness.data(n, 40 + i) for i, n in enumerate([3 * MiB + 5, MiB, 77])}
    m = cached_mount(store, mounter, want)
    errors = []
    start = threading.Barrier(12)

    def one(name):
        try:
            start.wait()
            fd = os.open(m.p(name), os.O_RDONLY)
            try:
                time.sleep(0.05)  # the other opens of the file come while this one is open
                assert read_fd(fd) == want[name], name
            finally:
                os.close(fd)
        except Exception as e:  # noqa: BLE001 - reported below, with the others
            errors.append(f"{name}: {e!r}")

    threads = [threading.Thread(target=one, args=(n,)) for n in list(want) * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    d = m.stats()["disk_cache"]
    assert d["passthrough_opens"] >= 1 and m.stats()["get_bytes"] == 0, d


def test_new_version_opened_while_the_old_one_is_read_through_the_daemon(store, mounter):
    """A handle reads the store's version of a file through the daemon (the page cache of
    the file); meanwhile this mount writes a new version, which its disk cache keeps whole.
    An open of the new version while the old handle is still open must not ask for
    passthrough (the kernel would fail it with EIO): it reads through the daemon, and sees
    the new bytes. Once all are closed, the next open uses passthrough."""
    name, old = "d/v.bin", harness.data(2 * MiB + 9, 51)
    new = harness.data(len(old), 52)
    store.put_many([(name, old)])
    m = mounter(store, "--disk-cache-size", SIZE)
    first = os.open(m.p(name), os.O_RDONLY)
    try:
        assert os.read(first, 4096) == old[:4096]
        with open(m.p(name), "wb") as f:
            f.write(new)
        m.sync()
        deadline = time.time() + 20
        while m.stats()["disk_cache"]["adopted_files"] < 1 and time.time() < deadline:
            time.sleep(0.05)
        with open(m.p(name), "rb") as f:
            assert f.read() == new
    finally:
        os.close(first)
    if m.stats()["disk_cache"]["passthrough_opens"] != 0:
        pytest.fail("passthrough while the old version was open: " + harness.tail(m.logpath))
    with open(m.p(name), "rb") as f:
        assert f.read() == new
    if m.stats()["disk_cache"]["passthrough_opens"] == 0:
        pytest.skip("no FUSE passthrough here (Linux 6.9+, CAP_SYS_ADMIN)")


def test_writer_is_refused_while_a_file_is_open_in_passthrough(store, mounter):
    """While a file is open in passthrough, an open that would write it cannot share its
    backing file: it fails with ETXTBSY (not the kernel's EIO) and changes nothing; once the
    reader closed it, the write goes through and the next read sees it."""
    name, content = "d/w.bin", harness.data(MiB + 3, 61)
    m = cached_mount(store, mounter, {name: content})
    fd = os.open(m.p(name), os.O_RDONLY)
    try:
        with pytest.raises(OSError) as e:
            os.open(m.p(name), os.O_WRONLY)
        assert e.value.errno == errno.ETXTBSY
        assert read_fd(fd) == content
    finally:
        os.close(fd)
    with open(m.p(name), "r+b") as f:
        f.write(b"new")
    with open(m.p(name), "rb") as f:
        assert f.read() == b"new" + content[3:]


def test_open_after_rename_shares_the_open_file(store, mounter):
    """A file open in passthrough and renamed (itself, or its directory) is the same inode
    under its new name: opens of the new name join its backing file and succeed."""
    name, content = "d/sub/r.bin", harness.data(MiB + 11, 71)
    m = cached_mount(store, mounter, {name: content})
    fd = os.open(m.p(name), os.O_RDONLY)
    try:
        os.rename(m.p(name), m.p("d/sub/r2.bin"))
        with open(m.p("d/sub/r2.bin"), "rb") as f:
            assert f.read() == content
        os.rename(m.p("d/sub"), m.p("d/sub2"))
        with open(m.p("d/sub2/r2.bin"), "rb") as f:
            assert f.read() == content
        assert read_fd(fd) == content
    finally:
        os.close(fd)


def test_off_never_uses_passthrough(store, mounter):
    """--passthrough=off: the daemon reads the cache's files in place."""
    name, content = "d/o.bin", harness.data(MiB, 81)
    m = mounter(store, "--disk-cache-size", SIZE)
    os.makedirs(m.p("d"))
    with open(m.p(name), "wb") as f:
        f.write(content)
    m.sync()
    m.close()
    m2 = mounter(store, "--disk-cache-size", SIZE, "-o", "passthrough=off",
                 cache_dir=m.cache_dir)
    with open(m2.p(name), "rb") as f:
        assert f.read() == content
    d = m2.stats()["disk_cache"]
    assert d["passthrough_opens"] == 0 and d["in_place_reads"] > 0, d


def test_signal_with_a_file_open_in_passthrough_exits_cleanly(store, mounter):
    """SIGTERM while a file is open in passthrough (its RELEASE never comes): the daemon
    unmounts and exits 0, and under ASan reports no leak of what it kept for the handle (a
    per-open allocation reachable only from libfuse's handle once leaked this way)."""
    name, content = "d/s.bin", harness.data(MiB, 91)
    m = cached_mount(store, mounter, {name: content})
    fd = os.open(m.p(name), os.O_RDONLY)
    try:
        assert os.read(fd, 10) == content[:10]
        os.kill(m.proc.pid, signal.SIGTERM)
        rc = m.proc.wait(15 * harness.slow_factor())
        m.closed = True  # reaped here
    finally:
        try:
            os.close(fd)
        except OSError:
            pass  # the mount is gone
    assert rc == 0, m.log()
    assert not harness.sanitizer_reports(m.log()), m.log()


def checked_when_settled(m, at_least):
    """disk_cache.checked_chunks once it reached at_least and stopped moving (the checks
    ahead run on the daemon's workers); what it is then, or the last value seen."""
    deadline = time.monotonic() + 30 * harness.slow_factor()
    last, still_since = None, time.monotonic()
    while time.monotonic() < deadline:
        now = m.stats()["disk_cache"]["checked_chunks"]
        if now != last:
            last, still_since = now, time.monotonic()
        elif now >= at_least and time.monotonic() - still_since > 0.5:
            return now
        time.sleep(0.05)
    return last


def test_opening_metadata_checks_each_ranks_first_file_ahead(store, mounter):
    """Every rank of a load opens the checkpoint's .metadata first, then its first file:
    on a restart, that open starts the checks of each rank's first file the disk cache
    holds (__R_0.distcp, R = 0, 1, ... while known), so the ranks' first opens find them
    checked. Rank 0's second file is left to the open of its first."""
    meta = harness.data(4096, 92)
    files = {f"ck/__{r}_{k}.distcp": harness.data(2 * MiB, 93 + 2 * r + k)
             for r, k in ((0, 0), (1, 0), (0, 1))}
    m = cached_mount(store, mounter, {"ck/.metadata": meta, **files})  # opens .metadata
    # .metadata's one chunk, then the 2 chunks of __0_0 and of __1_0 (not __0_1's)
    assert checked_when_settled(m, 5) == 5, m.stats()["disk_cache"]
    for name, content in files.items():
        with open(m.p(name), "rb") as f:
            assert f.read() == content, name
    assert m.stats()["get_bytes"] <= len(meta)  # the index build's GET of .metadata only


def test_opening_a_ranks_file_checks_its_next_eight_ahead(store, mounter):
    """A rank reads its files in order (torch 1.13 names, __R_K.distcp): the open of one
    starts the checks of the rank's next 8 (K+1 .. K+8) that the disk cache holds, so that
    they are checked (and read from the disk) while the rank still reads this one."""
    files = {f"ck/__0_{k}.distcp": harness.data(4096, 120 + k) for k in range(12)}
    m = cached_mount(store, mounter, files)  # opens __0_0
    # one chunk each: __0_0 and __0_1 .. __0_8
    assert checked_when_settled(m, 9) == 9, m.stats()["disk_cache"]
    with open(m.p("ck/__0_3.distcp"), "rb") as f:
        assert f.read() == files["ck/__0_3.distcp"]
    # __0_4 .. __0_11: only __0_9, __0_10 and __0_11 were not checked yet
    assert checked_when_settled(m, 12) == 12, m.stats()["disk_cache"]
    for name, content in files.items():
        with open(m.p(name), "rb") as f:
            assert f.read() == content, name
    assert m.stats()["get_bytes"] == 0
