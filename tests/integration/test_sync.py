"""sync and unmount (docs/semantics.md §4): the two ways a writer waits for the store.

`getfattr -n user.ckptfs.sync DIR` and `fsync` of a directory return once everything
written below the directory is on the store; an unmount returns at once, and the daemon
exits only after publishing what was staged. Checked on the store itself.
"""

import os

import pytest

import harness
from harness import MiB


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


@pytest.mark.parametrize("how", ["xattr", "fsyncdir"])
def test_a_directory_sync_returns_once_everything_below_it_is_on_the_store(wstore, mounter, how):
    """§4: a directory's sync seals and publishes every file below it before it returns."""
    # Held temporaries (*.tmp) wait 30 s for their rename unless a sync asks for them:
    # without the sync's rule, they would not be on the store yet.
    mnt = mounter(wstore, "--fsync=staged")
    files = {f"run/step_{i}/w.tmp": harness.data(MiB + i, seed=40 + i) for i in range(3)}
    for rel, data in files.items():
        write(mnt.p(rel), data)
    if how == "xattr":
        assert mnt.sync("run") == b"ok"
    else:
        fd = os.open(mnt.p("run"), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for rel, data in files.items():
        assert wstore.get(rel) == data, f"{rel} not on the store after the sync of run/"


def test_unmount_publishes_what_was_staged_before_the_daemon_exits(wstore, mounter):
    """§4: after an unmount the daemon publishes everything staged, then exits (status 0)."""
    mnt = mounter(wstore, "--fsync=staged")
    want = harness.data(12 * MiB + 3, seed=7)
    write(mnt.p("ck/model.tmp"), want)  # held: published only by the unmount's drain
    write(mnt.p("ck/small.bin"), b"x" * 100)
    assert mnt.unmount() == 0
    assert wstore.get("ck/model.tmp") == want
    assert wstore.get("ck/small.bin") == b"x" * 100
