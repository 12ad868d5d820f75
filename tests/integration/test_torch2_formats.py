"""tests/integration/test_torch2_formats.py - every format torch 2.6 / 2.14 writes, through
ckptfs-admin on a local directory, against what torch's own readers say (the expected JSON of
tests/fixtures/torch2, made by its make_fixtures.py in the chroots); and the commit rule of the
Hugging Face layout through a real mount (test_hf_index_json_published_last and
test_per_rank_metadata_waits_for_its_shards, torch 2.14 in its chroot, s3rver polled).

Env: CKPTFS_ADMIN (default build/tools/admin/ckptfs-admin).
"""

import json
import os
import shutil
import subprocess
import time

import pytest

import harness
from storepoll import StorePoller

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIX = os.path.join(REPO, "tests", "fixtures", "torch2")
ADMIN = harness.admin_bin()

if not os.path.exists(ADMIN):
    pytest.skip("ckptfs-admin not built at %s (set CKPTFS_ADMIN)" % ADMIN, allow_module_level=True)

FIXTURES = sorted(
    "%s/%s" % (v, n[:-len(".expected.json")])
    for v in os.listdir(FIX) if os.path.isdir(os.path.join(FIX, v))
    for n in os.listdir(os.path.join(FIX, v)) if n.endswith(".expected.json"))


def admin(*args, ok=(0,)):
    p = subprocess.run([ADMIN, *map(str, args)], capture_output=True, text=True, timeout=60)
    assert p.returncode in ok, (args, p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    return p


def admin_json(*args, ok=(0,)):
    return json.loads(admin(*args, "--json", ok=ok).stdout)


def expected(name):
    with open(os.path.join(FIX, name + ".expected.json"), encoding="utf-8") as f:
        return json.load(f)


def stored_items(exp):
    """Every item torch reads: (fqn, chunk offsets or None, file, offset, length, transforms)."""
    if exp["format"] == "safetensors":
        return [(s["fqn"], s["chunk_offset"], s["relative_path"], s["offset"], s["length"], None)
                for s in exp["storage"]]
    parts = exp["metadata_files"].values() if "metadata_files" in exp else [exp]
    out = []
    for md in parts:
        for s in md["storage"]:
            off, length = s["offset"], s["length"]
            if "tensor_bytes" in s:  # SAFETENSORS format: the tensor's bytes in the blob
                tb = s["tensor_bytes"]
                off, length = tb["begin"], tb["end"] - tb["begin"]
            out.append((s["fqn"], s["chunk_offset"], s["relative_path"], off, length,
                        s.get("transform_descriptors")))
    return out


def tensors(exp):
    if "metadata_files" not in exp:
        return exp["tensors"]
    merged = {}
    for md in exp["metadata_files"].values():
        for t in md["tensors"]:
            m = merged.setdefault(t["fqn"], {**t, "chunks": []})
            for c in t["chunks"]:
                if c not in m["chunks"]:
                    m["chunks"].append(c)
    return list(merged.values())


@pytest.mark.parametrize("name", FIXTURES)
def test_where_gives_what_torch_reads(name):
    """For every tensor torch's reader lists: dtype, shape, every chunk, and every stored item
    (file, offset, length; stored bytes for compressed ones) as `where --json` gives them."""
    exp = expected(name)
    ck = os.path.join(FIX, name)
    items = stored_items(exp)
    for t in tensors(exp):
        w = admin_json("where", ck, t["fqn"])
        assert w["kind"] == "tensor" and w["shape"] == t["size"], (t["fqn"], w)
        got = {(tuple(c["offsets"]), c["file"], c["offset"], c["length"],
                tuple(c.get("transform_descriptors") or ())) for c in w["chunks"]}
        assert {tuple(c["offsets"]) for c in t["chunks"]} == {g[0] for g in got}, t["fqn"]
        want = {(tuple(co), f, o, n, tuple(td or ())) for fqn, co, f, o, n, td in items
                if fqn == t["fqn"]}
        # where lists each chunk once (the first rank's copy where several ranks stored it)
        assert got <= want and len(got) == len(t["chunks"]), (t["fqn"], got, want)


@pytest.mark.parametrize("name", FIXTURES)
def test_index_holds_every_stored_item(name):
    """`index at FILE OFFSET` finds each item torch reads at its first byte, with its length
    (a per-rank checkpoint's copies too), and verify passes."""
    exp = expected(name)
    ck = os.path.join(FIX, name)
    v = admin_json("verify", ck)
    assert v["ok"], v["problems"]
    assert v["items"] == len(stored_items(exp))
    dump = admin_json("dump", ck)
    pairs = set()
    for s in dump.get("storage", []):
        pairs.add((s["fqn"], s["relative_path"], s["offset"], s["length"]))
    for fqn, _co, f, o, n, _td in stored_items(exp):
        if exp["format"] == "dcp":
            assert (fqn, f, o, n) in pairs, (fqn, f, o, n)
        else:
            hit = [t for t in dump["files"][f]["tensors"] if t["name"] == fqn]
            assert hit and hit[0]["abs_begin"] == o and hit[0]["abs_end"] == o + n, fqn


def test_per_rank_metadata_is_one_checkpoint():
    """__0.metadata and __1.metadata (use_collectives=False) are one checkpoint: ls lists it
    once, with every rank's files and items; one rank's file alone is that rank's part."""
    ck = os.path.join(FIX, "t2.14", "per_rank_meta")
    exp = expected("t2.14/per_rank_meta")
    ls = admin_json("ls", ck)
    assert ls["format"] == "dcp" and len(ls["tensors"]) == len(tensors(exp))
    ins = admin_json("inspect", ck)
    assert {f["name"]: f["items"] for f in ins["files"]} == {
        "__%d_0.distcp" % r: len(md["storage"])
        for r, md in enumerate(exp["metadata_files"].values())}
    assert ins["world_size"] == len(exp["metadata_files"])
    assert admin_json("dump", ck)["metadata_files"] == sorted(exp["metadata_files"])
    one = admin_json("verify", os.path.join(ck, "__1.metadata"))
    assert one["ok"] and one["items"] == len(exp["metadata_files"]["__1.metadata"]["storage"])


# ---------------------------------------------------------------------------
# The commit rule through a real mount (docs/semantics.md, "Commit files")
# ---------------------------------------------------------------------------

TRAINER = r'''
import os, sys
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

def hf(path):
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter
    g = torch.Generator().manual_seed(0)
    # 6 tensors of 4 MiB
    sd = {"layer%d.weight" % i: torch.randn(1024, 1024, generator=g) for i in range(6)}
    mapping = {k: i // 2 + 1 for i, k in enumerate(sd)}  # 3 shards of 8 MiB
    dcp.save(sd, storage_writer=HuggingFaceStorageWriter(path, fqn_to_index_mapping=mapping),
             no_dist=True)

def rank(r, world, port, path):
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=r, world_size=world)
    g = torch.Generator().manual_seed(r)
    sd = {"w%d" % i: torch.randn(512, 1024, generator=g) for i in range(4)}  # 8 MiB per rank
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(path), use_collectives=False)
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    if sys.argv[1] == "hf":
        hf(sys.argv[2])
    else:
        import socket
        import torch.multiprocessing as mp
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        mp.spawn(rank, args=(4, port, sys.argv[2]), nprocs=4)
'''


def run_trainer(torch2, what, path):
    script = os.path.join(torch2.work, "t2_commit_trainer.py")
    with open(script, "w") as f:
        f.write(TRAINER)
    r = torch2.run([torch2.inside(script), what, torch2.inside(path)], timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]


@pytest.fixture
def s3_store(s3server, request):
    return harness.S3Store(s3server, harness.unique_prefix(request.node.name))


def slow_shards(req):
    """Proxy policy: every write of a shard (.distcp, .safetensors) waits 0.5 s, so without
    the commit rule the small commit file, written last, would reach the store first."""
    if req.method in ("PUT", "POST") and (".distcp" in req.path or ".safetensors" in req.path) \
            and ".json" not in req.path:
        time.sleep(0.5)
    return "pass"


def slow_mount(chroot_mounter, s3server, s3_store, faultproxy):
    proxy = faultproxy(s3server.port)
    proxy.set_policy(slow_shards)
    return chroot_mounter(s3_store, "--fsync=staged", endpoint=proxy.endpoint)


def test_hf_index_json_published_last(torch2, chroot_mounter, s3server, s3_store, faultproxy):
    """A real HuggingFaceStorageWriter save (torch 2.14, 3 shards of 8 MiB) through a
    --fsync=staged mount on s3rver (shard writes slowed by a proxy):
    model.safetensors.index.json is never listed before every .safetensors its weight_map
    names."""
    if torch2.version != "2.14":
        pytest.skip("HuggingFaceStorageWriter is torch >= 2.8")
    m = slow_mount(chroot_mounter, s3server, s3_store, faultproxy)
    with StorePoller(s3_store, "hf", interval=0.01) as seen:
        run_trainer(torch2, "hf", m.p("hf"))
        m.sync("hf")
    with open(m.p("hf/model.safetensors.index.json")) as f:
        names = set(json.load(f)["weight_map"].values())
    assert len(names) == 3
    late = seen.listed_after("hf/model.safetensors.index.json", ["hf/" + n for n in names])
    assert not late, f"model.safetensors.index.json was listed before {late}"


def test_per_rank_metadata_waits_for_its_shards(torch2, chroot_mounter, s3server, s3_store,
                                                faultproxy):
    """dcp.save(use_collectives=False) from 4 gloo ranks (torch 2.14) through a
    --fsync=staged mount on s3rver: each __R.metadata is listed only once every shard it
    names is (shard writes slowed by a proxy); ckptfs-admin reads the result as one
    checkpoint of 4 ranks."""
    if torch2.version != "2.14":
        pytest.skip("use_collectives=False is torch >= 2.9")
    m = slow_mount(chroot_mounter, s3server, s3_store, faultproxy)
    with StorePoller(s3_store, "pr", interval=0.01) as seen:
        run_trainer(torch2, "per_rank", m.p("pr"))
        m.sync("pr")
    metas = sorted(k for k in seen.seen() if k.endswith(".metadata"))
    assert metas == ["pr/__%d.metadata" % r for r in range(4)], sorted(seen.seen())
    for r in range(4):
        own = admin_json("dump", m.p("pr/__%d.metadata" % r))
        shards = sorted({"pr/" + s["relative_path"] for s in own["storage"]})
        assert shards, own
        late = seen.listed_after("pr/__%d.metadata" % r, shards)
        assert not late, f"__{r}.metadata was listed before {late}"
    ins = admin_json("inspect", m.p("pr"))
    assert ins["world_size"] == 4 and len(ins["files"]) == 4
    assert admin_json("verify", m.p("pr"))["ok"]
