"""Renaming a directory that is on an S3 store (docs/semantics.md, "Renaming a directory on
the store"): a torch 1.13 DCP checkpoint staged under one name and renamed with os.rename
through the mount loads through a fresh mount under its new name and is gone under the old
one (both --fsync modes, s3rver and radosgw); a poller listing the store during the rename
never sees the new name's .metadata before every shard is there, and sees the old name's
.metadata go before any of its shards; kill -9 of the daemon mid-rename, then a remount with
the same cache directory, finishes the rename from the journal; a rename onto a non-empty
directory is ENOTEMPTY; above --rename-dir-max-objects it is EXDEV.
"""

import errno
import os
import subprocess
import threading
import time

import pytest

import harness

WORKLOAD = os.path.join(harness.REPO_ROOT, "tools", "lib", "dcp_workload.py")
PY = "/usr/bin/python3"
# 2 ranks, one file per item: 24 shards and a .metadata, more than the 8 copies in flight,
# so a commit file moved in the wrong step is seen by the poller
ARGS = ["--world", "2", "--mb", "6", "--layers", "3"]


def workload(op, path, check=True):
    r = subprocess.run([PY, WORKLOAD, op, path, *ARGS], capture_output=True, text=True,
                       timeout=600 * harness.slow_factor())
    if check:
        assert r.returncode == 0, f"{op} {path} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


class Slow:
    """A proxy policy: every request waits a little before it is forwarded; with an Event
    `uploads`, uploads (a PUT with a body that is not a server-side copy) after the first
    `let_through` wait until it is set."""

    def __init__(self, seconds, uploads=None, let_through=8):
        self.seconds, self.uploads, self.left = seconds, uploads, let_through
        self.lock = threading.Lock()

    def __call__(self, req):
        upload = (req.method == "PUT" and "x-amz-copy-source" not in req.headers
                  and int(req.headers.get("content-length", "0") or 0) > 0)
        if upload and self.uploads is not None:
            with self.lock:
                self.left -= 1
                hold = self.left < 0
            if hold:
                self.uploads.wait(120)
        time.sleep(self.seconds)
        return "pass"


class Lister:
    """Lists the store below a folder again and again while a rename runs; keeps every
    listing (a set of keys) in order."""

    def __init__(self, store, folder):
        self.store, self.folder = store, folder
        self.listings = []
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.is_set():
            self.listings.append(set(self.store.keys(self.folder)))
            time.sleep(0.01)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.t.join(10)


def check_order(listings, old, new, shards):
    """The commit rules of a directory rename (semantics.md §12), over a poller's
    listings: no listing shows new/.metadata without every shard at new/, and none shows
    old/.metadata without every shard at old/ (its .metadata goes first). Returns how many
    listings caught the rename in progress (objects under both names)."""
    moving = 0
    for keys in listings:
        if f"{new}/.metadata" in keys:
            missing = [s for s in shards if f"{new}/{s}" not in keys]
            assert not missing, f"{new}/.metadata listed before these shards: {missing}"
        if f"{old}/.metadata" in keys:
            gone = [s for s in shards if f"{old}/{s}" not in keys]
            assert not gone, f"{old}/.metadata still listed after these shards went: {gone}"
        moving += any(k.startswith(new + "/") for k in keys) and any(
            k.startswith(old + "/") for k in keys)
    return moving


def rename_and_check(store, a, fresh_mounter, poll, uploads=None):
    """Save a checkpoint at run/tmp, rename it to run/final through mount a, and check it.
    uploads: an Event the proxy holds uploads back until (set once the rename began)."""
    workload("save", a.p("run/tmp"))
    staged = a.stats()["write"]["pending_files"]
    failed = []

    def rename():
        try:
            os.rename(a.p("run/tmp"), a.p("run/final"))
        except OSError as e:
            failed.append(e)

    with Lister(store, "run") as lister:
        t = threading.Thread(target=rename)
        t.start()
        if uploads is not None:
            time.sleep(0.3)
            uploads.set()
        t.join(300 * harness.slow_factor())
    assert not t.is_alive() and not failed, failed
    assert not os.path.exists(a.p("run/tmp")) and os.path.isdir(a.p("run/final"))
    keys = [k for k in store.keys("run/") if k != "run/"]  # the parent's marker stays
    assert keys and all(k.startswith("run/final/") for k in keys), keys
    shards = [k[len("run/final/"):] for k in keys if k.endswith(".distcp")]
    assert "run/final/.metadata" in keys and len(shards) >= 16, keys
    moving = check_order(lister.listings, "run/tmp", "run/final", shards)
    if poll:
        assert moving >= 2, f"the poller saw the rename in progress {moving} times: too fast"
    b = fresh_mounter()
    workload("load", b.p("run/final"))
    assert not os.path.exists(b.p("run/tmp"))
    return staged


@pytest.mark.parametrize("fsync", ["staged", pytest.param("remote", marks=pytest.mark.matrix)])
def test_rename_checkpoint_dir_s3(s3server, mounter, faultproxy, fsync):
    """A DCP checkpoint renamed on s3rver, the store listed throughout (every request
    through a proxy that delays it, so the poller sees the copies in progress). In staged
    mode the rename comes while most files are still staged (the proxy lets 8 uploads
    through and holds the others back until the rename began): it publishes them, then
    copies the directory."""
    store = harness.S3Store(s3server, harness.unique_prefix(f"rename-{fsync}"))
    uploads = threading.Event() if fsync == "staged" else None
    slow = faultproxy(s3server.port, policy=Slow(0.03, uploads))
    a = mounter(store, f"--fsync={fsync}", endpoint=slow.endpoint)
    staged = rename_and_check(store, a, lambda: mounter(store), poll=True, uploads=uploads)
    if fsync == "staged":
        assert staged > 0, "the rename found nothing staged: not the staged case"
    assert "rename: run/tmp -> run/final: done" in a.log()


@pytest.mark.matrix
def test_rename_checkpoint_dir_rgw(rgw_store, mounter):
    """The same on radosgw (its CopyObject answers and ETags), remote mode."""
    a = mounter(rgw_store, "--fsync=remote")
    rename_and_check(rgw_store, a, lambda: mounter(rgw_store), poll=False)


def test_kill9_mid_rename_then_remount(s3server, mounter, faultproxy, tmp_path):
    """kill -9 of the daemon while a checkpoint directory is being copied to its new name:
    the new name then has no .metadata or is complete, one of the two names loads, and the
    remount with the same cache directory finishes the rename from the journal."""
    store = harness.S3Store(s3server, harness.unique_prefix("rename-kill9"))
    cache = str(tmp_path / "cache-crash")
    a = mounter(store, cache_dir=cache)
    workload("save", a.p("run/tmp"))
    a.close()
    slow = faultproxy(s3server.port, policy=Slow(0.15))
    a = mounter(store, endpoint=slow.endpoint, cache_dir=cache)
    mv = subprocess.Popen([PY, "-c", "import os, sys; os.rename(sys.argv[1], sys.argv[2])",
                           a.p("run/tmp"), a.p("run/final")],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(store.keys("run/final")) < 4:
        time.sleep(0.01)
    a.kill9()
    mv.communicate(timeout=60)
    assert mv.returncode != 0, "the rename finished before the kill: not a kill mid-rename"
    keys = store.keys("run")
    old = [k for k in keys if k.startswith("run/tmp/")]
    new = [k for k in keys if k.startswith("run/final/")]
    assert new, keys
    shards = [k[len("run/tmp/"):] for k in old if k.endswith(".distcp")]
    if "run/final/.metadata" in new:  # complete at the new name
        assert all(f"run/final/{s}" in new for s in shards), keys
    assert "run/tmp/.metadata" in old, "the old name lost its .metadata while copies ran"
    fresh = mounter(store)
    workload("load", fresh.p("run/tmp"))  # the old name is whole until the copies are done
    fresh.close()

    b = mounter(store, cache_dir=cache)
    deadline = time.monotonic() + 60 * harness.slow_factor()
    while "recover: the rename of directory" not in b.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    log = b.log()
    assert "recover: resuming the rename of directory run/tmp to run/final" in log, log[-3000:]
    assert "recover: the rename of directory run/tmp to run/final is complete" in log, log[-3000:]
    keys = [k for k in store.keys("run/") if k != "run/"]
    assert keys and all(k.startswith("run/final/") for k in keys), keys
    workload("load", b.p("run/final"))
    assert not os.path.exists(b.p("run/tmp"))
    b.close()
    c = mounter(store, cache_dir=cache)
    assert "resuming the rename" not in c.log(), "the journal record was not cleared"


@pytest.mark.parametrize("wstore", ["s3"], indirect=True)
def test_rename_onto_directories(wstore, mounter):
    """rename(2) onto an existing directory on the store: a non-empty one is ENOTEMPTY and
    both stay as they were; an empty one is replaced."""
    wstore.put("src/a/x.bin", b"x" * 1000)
    wstore.put("src/.metadata", b"m")
    wstore.put("full/y.bin", b"y")
    a = mounter(wstore)
    with pytest.raises(OSError) as e:
        os.rename(a.p("src"), a.p("full"))
    assert e.value.errno == errno.ENOTEMPTY
    assert wstore.keys("src") == ["src/.metadata", "src/a/x.bin"]
    assert wstore.keys("full") == ["full/y.bin"]
    os.mkdir(a.p("empty"))
    os.rename(a.p("src"), a.p("empty"))
    assert sorted(os.listdir(a.p("empty"))) == [".metadata", "a"]
    assert wstore.get("empty/a/x.bin") == b"x" * 1000
    assert not [k for k in wstore.keys("src")]
    assert not os.path.exists(a.p("src"))


@pytest.mark.parametrize("wstore", ["s3"], indirect=True)
def test_rename_dir_object_limit(wstore, mounter):
    """Above --rename-dir-max-objects a directory on the store is not renamed: EXDEV (mv
    then copies), and nothing moved."""
    wstore.put_many([(f"big/f{i}", b"z") for i in range(5)])
    a = mounter(wstore, "--rename-dir-max-objects", "4")
    with pytest.raises(OSError) as e:
        os.rename(a.p("big"), a.p("big2"))
    assert e.value.errno == errno.EXDEV
    assert len(wstore.keys("big/")) == 5 and not wstore.keys("big2/")
    b = mounter(wstore, "--rename-dir-max-objects", "5")
    os.rename(b.p("big"), b.p("big2"))
    assert len(wstore.keys("big2/")) == 5 and not wstore.keys("big/")
