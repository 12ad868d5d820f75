"""kill -9 of the daemon in the middle of a torch DCP save through a --fsync=staged mount,
then a remount with the same --cache-dir (docs/semantics.md §7): after a sync, the
checkpoint on the store is either complete (its .metadata is there and a load through a
fresh mount gives back every tensor) or has no .metadata; no multipart upload is left
behind; nothing staged is lost (uploaded, or kept under stage/recovered).

Uploads go through a proxy that slows every request down, so the kill finds uploads in
flight (parts, completes, the commit of .metadata waiting for its shards).
"""

import json
import os
import signal
import subprocess
import time

import pytest

import harness

WORKLOAD = os.path.join(harness.REPO_ROOT, "tools", "lib", "dcp_workload.py")
PY = "/usr/bin/python3"
ARGS = ["--world", "4", "--mb", "24", "--layers", "2"]  # per rank 6 MB: multipart


class Slow:
    """A proxy policy: every request waits a little before it is forwarded."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __call__(self, req):
        time.sleep(self.seconds)
        return "pass"


def start_save(path, layout):
    cmd = [PY, WORKLOAD, "save", path, *ARGS] + (["--per-rank"] if layout == "per-rank" else [])
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def stop_save(proc):
    """End the save's process group (we started it) if it still runs."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)


def recovered_files(cache_dir):
    out = []
    for d, _, files in os.walk(os.path.join(cache_dir, "stage", "recovered")):
        out += [os.path.relpath(os.path.join(d, f), cache_dir) for f in files]
    return out


# Two cases always run; the rest of the matrix is marked `matrix` (tools/test leaves it out
# of the ASan run to stay within CI's time).
CASES = [pytest.param(w, layout, marks=() if (w, layout) in (("after-save", "per-item"),
                                                              ("during-save", "per-rank"))
                      else pytest.mark.matrix)
         for w in ("during-save", "after-save", "while-committing")
         for layout in ("per-item", "per-rank")]


# radosgw is the S3 here: s3rver half-finishes a completion that a kill interrupts, and it
# cannot list multipart uploads, so "none left behind" could not be checked on it.
@pytest.mark.parametrize("wstore", ["rgw", "dir"], indirect=True)
@pytest.mark.parametrize("when,layout", CASES)
def test_kill9_during_a_staged_save_then_remount(wstore, mounter, faultproxy, tmp_path, when,
                                                 layout):
    cache = str(tmp_path / "cache-crash")
    ck = "crash/step_9"
    kw = {"cache_dir": cache}
    if wstore.kind == "s3":
        slow = faultproxy(wstore.server.port, policy=Slow(0.15))
        a = mounter(wstore, "--fsync=staged", "--part-size", "5M", endpoint=slow.endpoint, **kw)
    else:
        a = mounter(wstore, "--fsync=staged", "--part-size", "5M", **kw)
    save = start_save(a.p(ck), layout)
    if when == "during-save":
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and save.poll() is None:
            names = os.listdir(a.p(ck)) if os.path.isdir(a.p(ck)) else []
            if sum(n.endswith(".distcp") for n in names) >= 2:
                break
            time.sleep(0.01)
    else:
        save.wait(300 * harness.slow_factor())
        assert save.returncode == 0, save.stderr.read()[-3000:]
        if when == "while-committing":
            # the save returned (staged): wait until .metadata is staged and sealed
            deadline = time.monotonic() + 30
            while not os.path.exists(a.p(f"{ck}/.metadata")) and time.monotonic() < deadline:
                time.sleep(0.01)
    before = a.stats()["write"]
    a.kill9()
    stop_save(save)

    b = mounter(wstore, "--fsync=staged", "--part-size", "5M", **kw)
    # s3rver may have half-finished a completion the kill interrupted: it then answers 500
    # until ckptfs starts that upload over, and a sync reports the failed attempts meanwhile
    b.sync_until_ok(timeout=300)
    st = b.stats()["write"]
    assert st["pending_files"] == 0 and st["staged_bytes"] == 0, st
    keys = wstore.keys(ck)
    complete = f"{ck}/.metadata" in keys
    pending = before["pending_files"]  # staged and not yet published when the kill came
    if when == "during-save":
        # the kill came mid-save: the files being written were staged, not published
        assert pending > 0, f"the kill found nothing pending: not a kill during a save {before}"
    if pending > 0:
        # what was pending was taken over by the remount: sealed files from the journal
        # (recovered_files), files still being written kept under stage/recovered
        assert st["recovered_files"] > 0 or recovered_files(cache), (before, st)
    if when != "during-save":
        # the trainer's save returned: staged mode promised these bytes
        assert complete, f"the save returned but the checkpoint did not survive: {keys}"
    if complete:
        b.close()
        fresh = mounter(wstore)
        r = subprocess.run([PY, WORKLOAD, "load", fresh.p(ck), *ARGS], capture_output=True,
                           text=True, timeout=600 * harness.slow_factor())
        assert r.returncode == 0, f"load after recovery failed:\n{r.stderr[-3000:]}"
        load = json.loads(r.stdout.strip().splitlines()[-1])
        assert load["bytes"] > 0
    else:
        # an incomplete checkpoint never looks complete; what was being written is kept
        assert not any(k.endswith(".metadata") for k in keys), keys
        rec = recovered_files(cache)
        assert all(f"stage/recovered/{ck}/" in f for f in rec), rec
    left = wstore.uploads()
    assert not left, f"multipart uploads left behind: {left}"
    if pending == 0:
        # every upload had landed before the kill (possible after the save returned):
        # the checks above held, but this run did not exercise recovery
        pytest.skip(f"nothing was pending when the kill came ({when}): recovery not exercised")
