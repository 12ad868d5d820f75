"""tests/integration/test_full_disk.py - a cache folder on a full disk (a 2 MiB tmpfs filled
to the last byte) never kills the daemon. Each LMDB user there (the checkpoint index in
CACHE_DIR/index, the disk cache's catalogue in CACHE_DIR/disk-cache, the write journal in
CACHE_DIR/stage/journal) used to die of SIGBUS inside mdb_env_open when its lock file was
new: LMDB sizes that file with ftruncate (sparse) and writes it through a shared map, which
on a full file system has no page to land in. Now (index/lmdbenv.c):

- the index is off (one log line) and reads work without it;
- the disk cache is off (one log line) and reads go to the store;
- a mount that may write refuses to start, naming the journal's folder and the free space
  (writes would need that disk); a --read-only mount of the same folder works.

The store is s3rver (a local-directory store keeps no disk cache).
"""

import errno
import os
import subprocess
import time

import pytest

import harness
from harness import MiB


@pytest.fixture
def store(s3server):
    return harness.S3Store(s3server, harness.unique_prefix("full"))


@pytest.fixture
def small_dir(tmp_path):
    """A 2 MiB tmpfs for the cache folder (unmounted after the test, even on failure).
    Tests name it before mounter, so that their mounts are gone when it is unmounted."""
    with harness.tmpfs(str(tmp_path / "small"), "2m") as d:
        yield d


def fill(folder):
    """Fill folder's file system to the last byte (folder/junk)."""
    harness.fill_disk(folder)
    assert os.statvfs(folder).f_bavail == 0


def put_files(store, seed):
    want = {f"d/f{i}.bin": harness.data(n, seed * 10 + i) for i, n in enumerate([MiB + 7, 4097])}
    store.put_many(list(want.items()))
    return want


def read_all(m, want):
    for name, content in want.items():
        with open(m.p(name), "rb") as f:
            assert f.read() == content, name


def safetensors_shards(store, folder):
    """Two Hugging Face shards (the index indexes them when a listing shows them), made
    in folder and put on store."""
    from test_index_mount import write_safetensors

    want = {}
    for shard in (1, 2):
        tensors = [(f"l{shard}.w{i}", [64, 1024], harness.data(256 * 1024, 10 * shard + i))
                   for i in range(2)]
        path = os.path.join(folder, f"model-{shard}.safetensors")
        write_safetensors(path, tensors)
        with open(path, "rb") as f:
            want[f"hf/model-{shard}.safetensors"] = f.read()
    store.put_many(list(want.items()))
    return want


def test_index_off_on_a_full_disk(small_dir, store, mounter, tmp_path):
    """A fresh cache folder on a full disk: the index is off, listings and reads of a
    checkpoint work, the daemon exits 0 (it died of SIGBUS opening the index)."""
    want = safetensors_shards(store, str(tmp_path))
    fill(small_dir)
    m = mounter(store, "--read-only", cache_dir=small_dir)
    assert sorted(os.listdir(m.p("hf"))) == ["model-1.safetensors", "model-2.safetensors"]
    read_all(m, want)
    assert m.stats()["index"]["enabled"] is False
    m.close()
    log = m.log()
    assert "checkpoint index disabled" in log and "No space left on device" in log, log


def test_disk_cache_off_on_a_full_disk(small_dir, store, mounter):
    """--disk-cache-size with its folder new on a full disk: the disk cache is off (logged
    with the free space), reads come from the store (it died of SIGBUS opening the
    catalogue)."""
    want = put_files(store, 1)
    fill(small_dir)
    m = mounter(store, "--read-only", "--disk-cache-size", "64M", cache_dir=small_dir)
    read_all(m, want)
    st = m.stats()
    assert st["disk_cache"]["enabled"] is False
    assert st["get_bytes"] >= sum(len(c) for c in want.values())
    m.close()
    log = m.log()
    assert "disk-cache disabled" in log and "KiB free on its file system" in log, log


def test_write_mount_refuses_on_a_full_disk(small_dir, store, mounter):
    """A cache folder a read-only mount used (its index is there), then the disk filled: a
    mount that may write refuses to start, naming the journal's folder and the free space
    (it died of SIGBUS opening the journal); a read-only mount of the same folder works."""
    want = put_files(store, 2)
    m = mounter(store, "--read-only", cache_dir=small_dir)
    read_all(m, want)
    m.close()
    fill(small_dir)
    with pytest.raises(harness.HarnessError) as e:
        mounter(store, cache_dir=small_dir)
    msg = str(e.value)
    assert "exited with 1 before mounting" in msg, msg
    journal = os.path.join(small_dir, "stage", "journal")
    assert f"cannot open the journal in {journal}: No space left on device (0 KiB free" in msg, msg
    assert "--read-only" in msg, msg
    m = mounter(store, "--read-only", cache_dir=small_dir)
    read_all(m, want)


def test_writes_fail_with_enospc_when_the_disk_fills(small_dir, store, mounter):
    """A mount that started with room, then its cache disk filled: writing a file fails
    with ENOSPC (at its create: the journal's commit of new staging ids has no room; or at
    a write: the staging file has none), nothing is published, and the mount goes on:
    reads work, the daemon exits 0."""
    want = put_files(store, 3)
    m = mounter(store, cache_dir=small_dir)
    m.stats()  # answered: its LMDB files are made (the kernel mount comes before them)
    fill(small_dir)
    with pytest.raises(OSError) as e:
        with open(m.p("new.bin"), "wb") as f:
            for _ in range(4):  # 1 MiB: within the staging budget (~95% of 2 MiB)
                f.write(harness.data(256 * 1024, 9))
    assert e.value.errno == errno.ENOSPC, e.value
    read_all(m, want)
    os.unlink(os.path.join(small_dir, "junk"))
    m.close()
    assert store.get("new.bin") is None


def test_index_build_fails_cleanly_when_the_disk_fills(small_dir, store, mounter, tmp_path):
    """The index opened with room, then the disk filled: building a checkpoint's index
    fails (counted), listings and reads work."""
    want = safetensors_shards(store, str(tmp_path))
    m = mounter(store, "--read-only", cache_dir=small_dir)
    assert m.stats()["index"]["enabled"] is True
    fill(small_dir)
    assert sorted(os.listdir(m.p("hf"))) == ["model-1.safetensors", "model-2.safetensors"]
    ix = harness.wait_index(m, "failed", 1)
    read_all(m, want)
    assert ix["ready"] == 0, ix


def test_daemon_start_on_a_full_disk_fails_with_the_reason(small_dir, store, tmp_path):
    """Without -f (as mount(8) runs it) the same refusal is the command's: exit status 1
    and the reason on its stderr, nothing left mounted (it exited 0 once detached, the
    reason only in syslog, the mount gone a moment later)."""
    put_files(store, 4)
    m = harness.Mount(store.url, str(tmp_path), args=store.mount_args(), env=store.mount_env(),
                      cache_dir=small_dir)
    m.command()  # makes the cache folder
    os.makedirs(m.path)
    fill(small_dir)
    cmd = [harness.ckptfs_bin(), "--cache-dir", small_dir, *store.mount_args(), store.url, m.path]
    try:
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           env=m.env, timeout=60)
    finally:
        for _ in range(40):  # a daemon that started anyway: unmount it (it then exits)
            if not harness.mount_entry(m.path):
                break
            subprocess.run(["fusermount3", "-u", m.path], capture_output=True)
            time.sleep(0.25)
    assert r.returncode == 1, (r.returncode, r.stderr)
    journal = os.path.join(small_dir, "stage", "journal")
    assert f"ckptfs: cannot start the write path: cannot open the journal in {journal}: " \
           f"No space left on device (0 KiB free" in r.stderr, r.stderr
    assert not harness.mount_entry(m.path)
