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

import pytest

import harness
from storepoll import StorePoller

WORKLOAD = os.path.join(harness.REPO_ROOT, "tools", "lib", "dcp_workload.py")
PY = "/usr/bin/python3"
SMALL = ["--world", "4", "--mb", "24", "--layers", "3"]


def workload(op, path, *extra, timeout=600):
    cmd = [PY, WORKLOAD, op, path, *SMALL, *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout * harness.slow_factor())
    assert r.returncode == 0, f"{op} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def check_commit_order(store, poll, ckpt):
    """.metadata was not in a listing that lacked a shard, and (on a store that shows
    objects only whole) no object was seen before it had its final size."""
    meta = f"{ckpt}/.metadata"
    final = {k: store.size(k) for k in store.keys(ckpt)}
    shards = [k for k in final if k.endswith(".distcp")]
    assert shards and meta in final, f"checkpoint incomplete on the store: {sorted(final)}"
    if not store.shows_partial_objects:
        partial = {k: (poll.sizes_seen(k), final[k]) for k in final
                   if any(s != final[k] for s in poll.sizes_seen(k))}
        assert not partial, f"objects seen before they were complete: {partial}"
    late = poll.listed_after(meta, shards)
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
    with StorePoller(wstore, "ck/step_1") as poll:
        save = workload("save", mnt.p("ck/step_1"), *extra)
        mnt.sync()
    check_commit_order(wstore, poll, "ck/step_1")
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
    with StorePoller(wstore, ck) as poll:
        save = workload("save", a.p(ck), "--rank-dirs", ",".join(dirs))
        b.sync()
        a.sync()
    check_commit_order(wstore, poll, ck)
    assert a.stats()["write"]["commits"] == 1
    a.close()
    b.close()
    fresh = mounter(wstore)
    load = workload("load", fresh.p(ck))
    assert load["bytes"] == save["bytes"]



FIXTURES = os.environ.get("CKPTFS_FIXTURES",
                          os.path.join(os.path.dirname(harness.REPO_ROOT), "shared", "fixtures"))


@pytest.mark.parametrize("fsync", ["remote", "staged"])
def test_copy_of_a_checkpoint_with_metadata_first(wstore, mounter, fsync):
    """cp -r and rsync copy `.metadata` before the shards (it sorts first): every close
    returns 0 (in remote mode the close of a commit file waited for shards only this same
    copy would write next, until --commit-timeout, then failed with EIO), a sync then waits
    for the commit, and the store never lists `.metadata` before every shard (semantics.md
    §2, §6)."""
    src = os.path.join(FIXTURES, "dcp-torch1.13", "per_item")
    names = sorted(os.listdir(src))
    assert names[0] == ".metadata" and len(names) > 2, names
    m = mounter(wstore, f"--fsync={fsync}", "--commit-timeout=5")
    ck = "copied/step_1"
    os.makedirs(m.p(ck))
    with StorePoller(wstore, ck) as poll:
        for n in names:
            with open(os.path.join(src, n), "rb") as f, open(m.p(f"{ck}/{n}"), "wb") as g:
                g.write(f.read())  # the close raises OSError(EIO) if it timed out
        m.sync(timeout=120)
    check_commit_order(wstore, poll, ck)
    m.close()
    fresh = mounter(wstore)
    for n in names:
        with open(os.path.join(src, n), "rb") as a, open(fresh.p(f"{ck}/{n}"), "rb") as b:
            assert a.read() == b.read(), n
