"""Real torch saves through the mount: torch 1.13 DCP with 4 ranks (gloo on 127.0.0.1) in
both fsync modes and both layouts, loaded back through a fresh mount with a fresh cache
directory, every tensor compared; torch.save/torch.load of a whole state dict; two mounts
of one bucket as two nodes of one save; and a poller on the store that must never see a
`.metadata` before every shard of its directory is complete (docs/semantics.md §6).
"""

import json
import os
import subprocess
import sys
import threading
import time

import pytest

import harness

WORKLOAD = os.path.join(harness.REPO_ROOT, "tools", "lib", "dcp_workload.py")
PY = "/usr/bin/python3"
SMALL = ["--world", "4", "--mb", "24", "--layers", "3"]


def workload(op, path, *extra, timeout=600):
    cmd = [PY, WORKLOAD, op, path, *SMALL, *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout * harness.slow_factor())
    assert r.returncode == 0, f"{op} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


class Poller:
    """Watches a checkpoint directory on the store while a save runs: the first listing
    each key is in, and its size then. .metadata must not be in a listing that lacks a
    shard, and no object may be seen before it has its final size."""

    def __init__(self, store, ckpt):
        self.store, self.ckpt = store, ckpt
        self.first = {}  # key -> (time, size)
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)

    def run(self):
        listing = 0
        while not self.stop.is_set():
            listing += 1  # keys first seen in the same listing count as simultaneous
            for k in self.store.keys(self.ckpt):
                if k not in self.first and ".ckptfs-upload." not in k:
                    self.first[k] = (listing, self.store.size(k))
            time.sleep(0.02)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.t.join(10)

    def check(self):
        meta = f"{self.ckpt}/.metadata"
        final = {k: self.store.size(k) for k in self.store.keys(self.ckpt)}
        shards = [k for k in final if k.endswith(".distcp")]
        assert shards and meta in final, f"checkpoint incomplete on the store: {sorted(final)}"
        if not self.store.shows_partial_objects:
            partial = {k: (s, final[k]) for k, (_, s) in self.first.items()
                       if k in final and s != final[k]}
            assert not partial, f"objects seen before they were complete: {partial}"
        if meta in self.first:
            t_meta = self.first[meta][0]
            late = [k for k in shards if self.first.get(k, (t_meta + 1,))[0] > t_meta]
            assert not late, f".metadata appeared before these shards: {late}"


def matrix_unless(*keep):
    """Parameter sets for (fsync, layout): those in keep always run, the others are marked
    `matrix` (left out of the ASan run by tools/test to stay within CI's time)."""
    return [pytest.param(f, lay, marks=() if (f, lay) in keep else pytest.mark.matrix)
            for f in ("staged", "remote") for lay in ("per-item", "per-rank")]


@pytest.mark.parametrize("fsync,layout",
                         matrix_unless(("staged", "per-item"), ("remote", "per-rank")))
def test_dcp_save_then_load_through_a_fresh_mount(wstore, mounter, fsync, layout):
    extra = ["--per-rank"] if layout == "per-rank" else []
    mnt = mounter(wstore, f"--fsync={fsync}")
    with Poller(wstore, "ck/step_1") as poll:
        save = workload("save", mnt.p("ck/step_1"), *extra)
        mnt.sync()
    poll.check()
    st = mnt.stats()["write"]
    assert st["commits"] == 1 and st["pending_files"] == 0, st
    assert st["copy_requests"] == 0 and st["delete_requests"] == 0, st  # .metadata.tmp renamed free
    mnt.close()
    # a fresh mount with a fresh cache directory: everything comes from the store
    fresh = mounter(wstore)
    load = workload("load", fresh.p("ck/step_1"))
    assert load["bytes"] == save["bytes"], (save, load)


def test_torch_save_and_load_of_a_whole_state_dict(wstore, mounter):
    code = r"""
import sys, torch
torch.manual_seed(0)
sd = {f"layer{i}.weight": torch.randn(256, 300) for i in range(6)}
sd["step"] = 7
torch.save(sd, sys.argv[1])
back = torch.load(sys.argv[2])
assert back["step"] == 7
for k, v in sd.items():
    if k != "step":
        assert torch.equal(back[k], v), k
print("ok")
"""
    mnt = mounter(wstore, "--part-size", "5M")
    os.makedirs(mnt.p("pt"), exist_ok=True)
    r = subprocess.run([PY, "-c", code, mnt.p("pt/model.pt"), mnt.p("pt/model.pt")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
    mnt.sync()
    mnt.close()
    fresh = mounter(wstore)
    r = subprocess.run([PY, "-c", code.replace("torch.save(sd, sys.argv[1])", "pass"),
                        fresh.p("pt/model.pt"), fresh.p("pt/model.pt")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


@pytest.mark.parametrize("fsync", ["staged", pytest.param("remote", marks=pytest.mark.matrix)])
def test_two_mounts_as_two_nodes_commit_after_all_shards(wstore, mounter, fsync):
    """Ranks 0-1 save through one mount, 2-3 through another (two nodes, one bucket): the
    .metadata rank 0 writes reaches the store only after all four ranks' shards."""
    a = mounter(wstore, f"--fsync={fsync}")
    b = mounter(wstore, f"--fsync={fsync}")
    ck = "two/step_5"
    dirs = [a.p(ck), a.p(ck), b.p(ck), b.p(ck)]
    with Poller(wstore, ck) as poll:
        save = workload("save", a.p(ck), "--rank-dirs", ",".join(dirs))
        b.sync()
        a.sync()
    poll.check()
    assert a.stats()["write"]["commits"] == 1
    a.close()
    b.close()
    fresh = mounter(wstore)
    load = workload("load", fresh.p(ck))
    assert load["bytes"] == save["bytes"]
