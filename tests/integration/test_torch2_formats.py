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
import threading
import time

import pytest

import harness

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
                off, length = s["tensor_bytes"]["begin"], s["tensor_bytes"]["end"] - s["tensor_bytes"]["begin"]
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
    one = admin_json("verify", os.path.join(ck, "__1.metadata"))
    assert one["ok"] and one["items"] == len(exp["metadata_files"]["__1.metadata"]["storage"])
