"""tests/integration/test_posix.py - what ordinary tools expect of a filesystem beyond
reads and writes: directory times (semantics.md §10).

Run on s3rver, radosgw and a local directory (the `wstore` fixture), through real mounts.
"""

import os
import re
import shutil
import subprocess
import time

import pytest

import harness

FSYNC_MODES = ["remote", "staged"]


def save_checkpoint(root, name, files=3, size=4096):
    """What a trainer's save does: make the directory, write files in it, fsync each."""
    d = os.path.join(root, name)
    os.makedirs(d)
    for i in range(files):
        with open(os.path.join(d, f"part{i}.bin"), "wb") as f:
            f.write(harness.data(size, seed=i))
            f.flush()
            os.fsync(f.fileno())
    return d


def dir_mtimes(root, prefix="checkpoint-"):
    """{name: st_mtime_ns} of root's directories named prefix*, through readdir + stat
    (as glob + os.path.getmtime do: the attributes come from the readdir)."""
    return {e.name: e.stat().st_mtime_ns for e in os.scandir(root)
            if e.name.startswith(prefix) and e.is_dir()}


def store_resolution(store):
    """Seconds between two saves that every mount can tell apart: s3rver keeps whole
    seconds of LastModified, radosgw milliseconds, a local directory nanoseconds."""
    return 1.1 if type(store) is harness.S3Store else 0.3


def rotate_like_hf_trainer(root, limit):
    """Hugging Face Trainer's checkpoint rotation (`_sorted_checkpoints(use_mtime=True)`
    and `_rotate_checkpoints`): order checkpoint-* by (mtime, path), delete the oldest
    beyond `limit`. Returns the names deleted."""
    paths = [os.path.join(root, n) for n in os.listdir(root)
             if re.fullmatch(r"checkpoint-\d+", n) and os.path.isdir(os.path.join(root, n))]
    ordered = sorted((os.path.getmtime(p), p) for p in paths)
    gone = []
    for _, p in ordered[:max(0, len(ordered) - limit)]:
        shutil.rmtree(p)
        gone.append(os.path.basename(p))
    return gone


@pytest.mark.parametrize("fsync", FSYNC_MODES)
def test_directory_times_follow_their_newest_entry_on_every_mount(wstore, mounter, fsync):
    """§10: a directory's mtime is the time of its newest entry, stable while nothing
    changes, the same on a second mount; never the mount's start or 'now'."""
    mnt = mounter(wstore, f"--fsync={fsync}")
    started = time.time_ns()
    time.sleep(1.1)
    names = ["checkpoint-5", "checkpoint-10", "checkpoint-15"]
    created = {}
    for n in names:
        t0 = time.time_ns()
        save_checkpoint(mnt.p("run"), n)
        created[n] = (t0, time.time_ns())
        time.sleep(1.1)
    seen = dir_mtimes(mnt.p("run"))
    assert sorted(seen, key=seen.get) == names, (seen, created)
    for n in names:
        assert seen[n] > started, (n, seen[n], started)
    mnt.sync()
    after_sync = dir_mtimes(mnt.p("run"))
    assert sorted(after_sync, key=after_sync.get) == names, after_sync
    time.sleep(2.2)  # past --attr-timeout: the times are asked again, and do not move
    again = dir_mtimes(mnt.p("run"))
    assert again == after_sync
    assert os.stat(mnt.p("run/checkpoint-5")).st_mtime_ns == after_sync["checkpoint-5"]
    # `ls -t` lists them newest first
    ls = subprocess.run(["ls", "-t", mnt.p("run")], capture_output=True, text=True, check=True)
    assert ls.stdout.split() == names[::-1]

    other = mounter(wstore)
    fresh = dir_mtimes(other.p("run"))
    assert sorted(fresh, key=fresh.get) == names, fresh
    # The same times, to the store's resolution (s3rver keeps whole seconds; the
    # writing mount knows when it published, a little after the store's stamp)
    for n in names:
        assert 0 <= after_sync[n] - fresh[n] < 1_100_000_000, (n, fresh, after_sync)
    time.sleep(2.2)
    assert dir_mtimes(other.p("run")) == fresh
    assert os.stat(other.p("run")).st_mtime_ns >= fresh["checkpoint-15"] or \
        isinstance(wstore, harness.DirStore)


@pytest.mark.parametrize("fsync", FSYNC_MODES)
def test_hf_trainer_rotation_keeps_the_newest_checkpoints(wstore, mounter, fsync):
    """§10: save_total_limit=2 after steps 5, 10, 15, 20 keeps exactly the newest two, on
    the writing mount and on a fresh one (the rotation orders by mtime; names tie-break
    'checkpoint-10' before 'checkpoint-5', so equal times delete the wrong one)."""
    mnt = mounter(wstore, f"--fsync={fsync}")
    for step in (5, 10, 15):
        save_checkpoint(mnt.p("out"), f"checkpoint-{step}", files=2)
        rotate_like_hf_trainer(mnt.p("out"), 2)
        time.sleep(store_resolution(wstore))
    assert sorted(os.listdir(mnt.p("out"))) == ["checkpoint-10", "checkpoint-15"]
    mnt.sync()
    resumed = mounter(wstore, f"--fsync={fsync}")  # a resumed run, through a fresh mount
    save_checkpoint(resumed.p("out"), "checkpoint-20", files=2)
    assert rotate_like_hf_trainer(resumed.p("out"), 2) == ["checkpoint-10"]
    assert sorted(os.listdir(resumed.p("out"))) == ["checkpoint-15", "checkpoint-20"]


def test_removing_an_entry_moves_its_directory_time_on_the_mount_that_did_it(wstore, mounter):
    """§10: unlink, rmdir and rename change the directory's time (POSIX), also when the
    newest entry is left where it was and the store has nothing to show for it."""
    mnt = mounter(wstore)
    d = mnt.p("d")
    os.makedirs(os.path.join(d, "sub"))
    for n in ("a", "b", "c"):
        with open(os.path.join(d, n), "wb") as f:
            f.write(b"x")
    mnt.sync()
    time.sleep(1.1)
    before = os.stat(d).st_mtime_ns
    for change in (lambda: os.unlink(os.path.join(d, "a")),
                   lambda: os.rmdir(os.path.join(d, "sub")),
                   lambda: os.rename(os.path.join(d, "b"), mnt.p("b-moved"))):
        t0 = time.time_ns()
        change()
        now = os.stat(d).st_mtime_ns
        assert now >= t0 - 10_000_000 and now > before, (now, t0, before)
        before = now
        time.sleep(0.05)


def test_a_listing_during_uploads_shows_each_name_once(wstore, mounter):
    """A listing made while staged files finish their uploads names each entry once
    (a file or directory that left staging between the overlay's report and the
    store's listing was reported by both; the rotation above then counted it twice)."""
    mnt = mounter(wstore, "--fsync=staged")
    root = mnt.p("out")
    os.makedirs(root)
    dupes = []
    for step in range(12):
        save_checkpoint(root, f"checkpoint-{step}", files=2, size=1024)
        for _ in range(15):
            names = os.listdir(root)
            if len(names) != len(set(names)):
                dupes.append(sorted(names))
    assert not dupes, dupes[:3]
