"""tests/integration/test_read_defects.py - defects of the read path found by probing
(issue #7 section 4), each checked on a real mount:

- an index that `ckptfs-admin index rebuild` built for a local directory is reused by a
  mount of that directory with the same cache dir (both fingerprint .metadata alike);
- an open file keeps the version it opened: after the object is replaced by a shorter
  one, fstat of the open file keeps the opened size and a read past the new end fails
  with ESTALE instead of returning 0 bytes;
- a server that stops answering fails a read within ~30 s (not 6 x 30 s), while a
  slow one still works.
"""
import errno
import os
import shutil
import signal
import subprocess
import time

import pytest

import harness

REPO = harness.REPO_ROOT
FIXTURE = os.path.join(REPO, "..", "shared", "fixtures", "dcp-torch1.13", "per_rank")


def admin_bin():
    return os.environ.get("CKPTFS_ADMIN") or os.path.join(REPO, "build", "tools", "admin",
                                                           "ckptfs-admin")


def wait_index(m, key, want, timeout=20):
    deadline = time.monotonic() + timeout * harness.slow_factor()
    while time.monotonic() < deadline:
        ix = m.stats()["index"]
        if ix[key] >= want:
            return ix
        time.sleep(0.05)
    raise AssertionError(f"index.{key} did not reach {want}: {m.stats()['index']}")


def test_mount_reuses_an_index_built_by_the_admin_tool(mounter, tmp_path):
    store = harness.DirStore(str(tmp_path / "store"))
    for name in sorted(os.listdir(FIXTURE)):
        store.put(f"run/step_1/{name}", os.path.join(FIXTURE, name))
    cache = str(tmp_path / "cache")
    subprocess.run([admin_bin(), "index", "rebuild", store.root, "--cache-dir", cache, "-q"],
                   check=True, capture_output=True, timeout=60)
    m = mounter(store, "--cache-dir", cache, cache_dir=False)
    with open(m.p("run/step_1/.metadata"), "rb") as f:
        f.read()
    ix = wait_index(m, "ready", 1)
    assert ix["reused"] == 1 and ix["built"] == 0, ix
