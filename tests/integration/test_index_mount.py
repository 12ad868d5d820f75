"""tests/integration/test_index_mount.py - the checkpoint index inside the mount.

A real torch 1.13 DCP checkpoint (2 ranks, one file per rank, 8 items of ~2 MB each)
is put on each store. Checks: opening .metadata builds the index under the cache dir
(ckptfs-admin sees it), a remount with the same cache dir reuses it, a changed
.metadata rebuilds it, an unparsable .metadata leaves reads working with one log
line, and reads are guided by the index (a read inside an item fetches that whole
item and not the rest of the file; reads that step through the items fetch ahead).

The other formats the offline index reads are indexed by the mount too: the real
torch 2.14 saves of tests/fixtures/torch2 (per-rank __R.metadata of
use_collectives=False; Hugging Face shards with and without their index json) get an
index when a listing shows them, built with one GET per metadata file and no other
request, reused on a remount, rebuilt when one __R.metadata changes. Reads inside an
item are guided for a per-rank checkpoint (the torch 1.13 one above, its .metadata
split into one __R.metadata per rank with torch 1.13's own classes) and for Hugging
Face shards of ~2 MiB tensors written here in the safetensors format.
"""
import json
import os
import struct
import subprocess
import time

import pytest

import harness

REPO = harness.REPO_ROOT
WORKLOAD = os.path.join(REPO, "tools", "lib", "dcp_workload.py")
MiB = 1 << 20


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A per-rank DCP checkpoint saved by torch 1.13 on local disk."""
    d = str(tmp_path_factory.mktemp("ckpt") / "step_1")
    subprocess.run(["/usr/bin/python3", WORKLOAD, "save", d, "--world", "2", "--mb", "32",
                    "--layers", "2", "--per-rank"], check=True, capture_output=True, timeout=300)
    return d


def put_checkpoint(store, src, prefix="run/step_1"):
    store.put_many([(f"{prefix}/{f}", os.path.join(src, f)) for f in sorted(os.listdir(src))])
    return prefix


def where(src, fqn):
    out = subprocess.run([harness.admin_bin(), "where", src, fqn, "--json"], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout)["chunks"]


def open_metadata(m, prefix):
    with open(m.p(f"{prefix}/.metadata"), "rb") as f:
        return f.read()


def test_index_built_on_open_and_reused_on_remount(store, mounter, checkpoint, tmp_path):
    prefix = put_checkpoint(store, checkpoint)
    cache = str(tmp_path / "shared-cache")
    m = mounter(store, "--cache-dir", cache, cache_dir=False)
    assert m.stats()["index"]["enabled"] is True
    with open(os.path.join(checkpoint, ".metadata"), "rb") as f:
        assert open_metadata(m, prefix) == f.read()
    ix = harness.wait_index(m, "ready", 1)
    assert ix["built"] == 1 and ix["reused"] == 0 and ix["failed"] == 0
    m.close()

    # The index is on local disk under the cache dir, where ckptfs-admin finds it.
    out = subprocess.run([harness.admin_bin(), "index", "ls", "--cache-dir", cache, "--json"],
                         check=True, capture_output=True, text=True)
    keys = [c["key"] for c in json.loads(out.stdout)["checkpoints"]]
    assert any(k.endswith("/run/step_1") for k in keys), keys

    m2 = mounter(store, "--cache-dir", cache, cache_dir=False)
    open_metadata(m2, prefix)
    ix = harness.wait_index(m2, "ready", 1)
    assert ix["reused"] == 1 and ix["built"] == 0, ix


def test_admin_index_of_an_untidy_url_is_reused_by_the_mount(store, mounter, checkpoint,
                                                             tmp_path):
    # ckptfs-admin keyed "s3://bucket//prefix/./run/" by the URL as typed,
    # the mount by the cleaned one: the mount built its own index instead
    if not isinstance(store, harness.S3Store):
        pytest.skip("local paths go through realpath on both sides")
    prefix = put_checkpoint(store, checkpoint)
    bucket, _, root = store.url[len("s3://"):].partition("/")
    for n, form in enumerate(("s3://%s//%s/run/", "s3://%s/./%s/./run//.")):
        cache = str(tmp_path / ("shared-cache-%d" % n))
        untidy = form % (bucket, root)
        out = subprocess.run([harness.admin_bin(), "index", "rebuild", untidy,
                              *store.mount_args(), "--cache-dir", cache, "--json", "-q"],
                             capture_output=True, text=True,
                             env={**os.environ, **store.mount_env()}, timeout=120)
        assert out.returncode == 0, out.stderr
        keys = [c["key"] for c in json.loads(out.stdout)["checkpoints"]]
        assert keys == [store.url + "/" + prefix], (untidy, keys)
        m = mounter(store, "--cache-dir", cache, cache_dir=False)
        open_metadata(m, prefix)
        ix = harness.wait_index(m, "ready", 1)
        assert ix["reused"] == 1 and ix["built"] == 0, (untidy, ix)
        m.close()


def test_listing_a_checkpoint_directory_indexes_it(store, mounter, checkpoint):
    prefix = put_checkpoint(store, checkpoint)
    m = mounter(store)
    assert ".metadata" in os.listdir(m.p(prefix))
    ix = harness.wait_index(m, "ready", 1)
    assert ix["built"] == 1


def test_changed_metadata_rebuilds(store, mounter, checkpoint, tmp_path):
    prefix = put_checkpoint(store, checkpoint)
    cache = str(tmp_path / "cache")
    m = mounter(store, "--cache-dir", cache, "--attr-timeout", "0.2", cache_dir=False)
    open_metadata(m, prefix)
    harness.wait_index(m, "built", 1)
    # Replace .metadata with another valid one (different items): a new version.
    other = os.path.join(harness.REPO_ROOT, "..", "shared", "fixtures", "dcp-torch1.13",
                         "per_rank", ".metadata")
    store.put(f"{prefix}/.metadata", open(other, "rb").read())
    # past --attr-timeout and the 2 s a load keeps a checkpoint's listing (semantics.md §2)
    time.sleep(2.5)
    open_metadata(m, prefix)
    ix = harness.wait_index(m, "built", 2)
    assert ix["failed"] == 0


def test_unparsable_metadata_reads_still_work(store, mounter, tmp_path):
    garbage = b"\x80\x04this is not a DCP pickle" + bytes(range(256)) * 8
    shard = harness.data(3 * MiB + 7, seed=11)
    store.put("bad/.metadata", garbage)
    store.put("bad/__0_0.distcp", shard)
    m = mounter(store, "--attr-timeout", "0.2")
    for _ in range(3):
        assert open_metadata(m, "bad") == garbage
        assert sorted(os.listdir(m.p("bad"))) == [".metadata", "__0_0.distcp"]
        time.sleep(0.3)
    with open(m.p("bad/__0_0.distcp"), "rb") as f:
        assert f.read() == shard
    ix = harness.wait_index(m, "failed", 1)
    assert ix["ready"] == 0 and ix["failed"] == 1, ix
    m.close()
    lines = [ln for ln in m.log().splitlines() if "cannot index" in ln]
    assert len(lines) == 1, lines  # logged once for this version, however often it is opened
    assert "reads continue" in lines[0]


def test_read_inside_an_item_fetches_that_item(store, mounter, checkpoint):
    if store.kind == "dir":
        pytest.skip("the local store hands its files to the kernel (splice): nothing to prefetch")
    prefix = put_checkpoint(store, checkpoint)
    chunk = where(checkpoint, "layers.1.mlp.up.weight")[0]
    path = f"{prefix}/{chunk['file']}"
    size = os.path.getsize(os.path.join(checkpoint, chunk["file"]))
    m = mounter(store)
    open_metadata(m, prefix)
    harness.wait_index(m, "ready", 1)
    before = m.stats()["get_bytes"]
    with open(m.p(path), "rb", buffering=0) as f:
        got = os.pread(f.fileno(), 4096, chunk["offset"] + 100)
    with open(os.path.join(checkpoint, chunk["file"]), "rb") as f:
        f.seek(chunk["offset"] + 100)
        assert got == f.read(4096)
    # Let the background fetches of the item finish, then count.
    time.sleep(0.5 * harness.slow_factor())
    st = m.stats()
    fetched = st["get_bytes"] - before
    assert st["index"]["item_prefetches"] >= 1
    assert fetched >= chunk["length"], (fetched, chunk)  # the whole item ...
    assert fetched <= chunk["length"] + 2 * MiB, (fetched, chunk)  # ... in 1 MiB blocks
    assert fetched < size / 2  # not the file


def test_sequential_items_are_fetched_ahead_and_exact(store, mounter, checkpoint):
    if store.kind == "dir":
        pytest.skip("the local store hands its files to the kernel (splice): nothing to prefetch")
    prefix = put_checkpoint(store, checkpoint)
    # through the page cache (this checkpoint's ShardedTensor files are read direct by
    # default, where the sequential readahead fetches ahead: checked exact below)
    for args in (["--direct-reads=none"], []):
        m = mounter(store, *args)
        open_metadata(m, prefix)
        harness.wait_index(m, "ready", 1)
        for name in ("__0_0.distcp", "__1_0.distcp"):
            want = harness.sha256(open(os.path.join(checkpoint, name), "rb").read())
            got, n = harness.sha256_file(m.p(f"{prefix}/{name}"), chunk=256 * 1024)
            assert got == want and n == os.path.getsize(os.path.join(checkpoint, name))
        st = m.stats()
        if args:
            assert st["index"]["item_prefetches"] >= 8, st["index"]
        size = os.path.getsize(os.path.join(checkpoint, name))
        assert st["get_bytes"] <= 1.05 * 2 * size + 8192, (args, st["get_bytes"])
        m.close()


def test_torch_load_through_the_mount(store, mounter, checkpoint):
    """A real DCP load (2 ranks, gloo) through the mount, every value verified."""
    prefix = put_checkpoint(store, checkpoint)
    m = mounter(store)
    out = subprocess.run(["/usr/bin/python3", WORKLOAD, "load", m.p(prefix), "--world", "2",
                          "--mb", "32", "--layers", "2"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["bytes"] > 30_000_000
    st = m.stats()
    assert st["index"]["ready"] == 1
    assert st["get_bytes"] <= 1.05 * st["read_bytes"] + 2 * MiB


def test_killed_daemon_fails_fast_and_remount_recovers(store, mounter, checkpoint, tmp_path):
    """kill -9 of the daemon: accesses fail at once with ENOTCONN (no hang), the dead
    mount unmounts, and a new mount with the same cache dir serves exact bytes and
    finds its index (reused, or rebuilt if the kill lost it) in good order."""
    import errno
    import signal

    prefix = put_checkpoint(store, checkpoint)
    cache = str(tmp_path / "cache")
    m = mounter(store, "--cache-dir", cache, cache_dir=False)
    open_metadata(m, prefix)
    harness.wait_index(m, "ready", 1)
    os.kill(m.proc.pid, signal.SIGKILL)
    m.proc.wait(10)

    def probe():  # a listing always reaches the daemon (no kernel cache answers it)
        try:
            os.listdir(m.p(prefix))
        except OSError as e:
            return e.errno
        return 0

    assert harness.call_with_timeout(probe, 10, "stat on a dead mount") == errno.ENOTCONN
    m.close(expect_rc=None)  # unmounts the dead mount; -9 is the expected status

    m2 = mounter(store, "--cache-dir", cache, cache_dir=False)
    open_metadata(m2, prefix)
    ix = harness.wait_index(m2, "ready", 1)
    assert ix["failed"] == 0 and ix["reused"] + ix["built"] == 1
    name = "__1_0.distcp"
    got, _ = harness.sha256_file(m2.p(f"{prefix}/{name}"))
    assert got == harness.sha256(open(os.path.join(checkpoint, name), "rb").read())


def test_lookups_in_a_checkpoint_dir_use_one_listing(store, mounter, checkpoint):
    """Opening every shard of a noticed checkpoint costs at most a listing (the one made
    when its .metadata was opened may answer them all), not a HEAD per file."""
    prefix = put_checkpoint(store, checkpoint)
    m = mounter(store, "--attr-timeout", "30")
    open_metadata(m, prefix)
    harness.wait_index(m, "ready", 1)
    before = m.stats()
    names = [f for f in sorted(os.listdir(checkpoint)) if f != ".metadata"]
    for name in names:
        with open(m.p(f"{prefix}/{name}"), "rb") as f:
            assert f.read(16) == open(os.path.join(checkpoint, name), "rb").read(16)
    after = m.stats()
    assert after["head_requests"] - before["head_requests"] == 0, (before, after)
    assert after["list_requests"] - before["list_requests"] <= 2, (before, after)
    assert names  # each would cost a HEAD without the listing


# ---- per-rank (__R.metadata) and Hugging Face checkpoints -----------------------------

TORCH2_FIX = os.path.join(REPO, "tests", "fixtures", "torch2", "t2.14")

# torch 1.13's Metadata classes: one __R.metadata per rank, each with the items of that
# rank's file and the chunks they hold (what dcp.save(use_collectives=False) writes).
SPLIT_PER_RANK = r"""
import os, pickle, shutil, sys
sys.path.insert(0, sys.argv[3])
import dcp_workload  # noqa: F401  (torch 1.13's import shim for Python 3.11)
from torch.distributed._shard.checkpoint.metadata import Metadata, TensorStorageMetadata
src, dst = sys.argv[1], sys.argv[2]
md = pickle.load(open(os.path.join(src, ".metadata"), "rb"))
os.makedirs(dst)
for rank, name in enumerate(sorted({si.relative_path for si in md.storage_data.values()})):
    storage = {k: v for k, v in md.storage_data.items() if v.relative_path == name}
    sdm = {}
    for fqn, meta in md.state_dict_metadata.items():
        mine = {tuple(k.offset) for k in storage if k.fqn == fqn}
        if mine and isinstance(meta, TensorStorageMetadata):
            meta = TensorStorageMetadata(meta.properties, meta.size,
                                         [c for c in meta.chunks if tuple(c.offsets) in mine])
        if mine:
            sdm[fqn] = meta
    with open(os.path.join(dst, "__%d.metadata" % rank), "wb") as f:
        pickle.dump(Metadata(state_dict_metadata=sdm, planner_data=None, storage_data=storage), f)
    shutil.copy(os.path.join(src, name), os.path.join(dst, name))
"""


@pytest.fixture(scope="module")
def per_rank_checkpoint(checkpoint, tmp_path_factory):
    """The torch 1.13 checkpoint with __0.metadata and __1.metadata instead of .metadata."""
    d = str(tmp_path_factory.mktemp("per_rank") / "step_1")
    subprocess.run(["/usr/bin/python3", "-c", SPLIT_PER_RANK, checkpoint, d,
                    os.path.join(REPO, "tools", "lib")], check=True, capture_output=True,
                   timeout=120)
    return d


def write_safetensors(path, tensors):
    """A safetensors file (8-byte header length, JSON header, data) of F32 tensors
    [(name, shape, bytes)], in order."""
    header, off = {}, 0
    for name, shape, b in tensors:
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, _, b in tensors:
            f.write(b)


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
    """Two Hugging Face shards of four 2 MiB tensors each, with their index json."""
    d = tmp_path_factory.mktemp("hf") / "model"
    d.mkdir()
    weight_map = {}
    for shard in (1, 2):
        name = f"model-0000{shard}-of-00002.safetensors"
        tensors = [(f"layers.{shard}.w{i}", [512, 1024], harness.data(2 * MiB, seed=10 * shard + i))
                   for i in range(4)]
        write_safetensors(str(d / name), tensors)
        weight_map.update({t[0]: name for t in tensors})
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 16 * MiB}, "weight_map": weight_map}))
    return str(d)


def put_dir(store, src, prefix, skip=()):
    store.put_many([(f"{prefix}/{f}", os.path.join(src, f)) for f in sorted(os.listdir(src))
                    if f not in skip and os.path.isfile(os.path.join(src, f))])


def requests(st):
    return {k: st[k] for k in ("get_requests", "head_requests", "list_requests")}


def test_per_rank_and_hugging_face_checkpoints_are_indexed_and_reused(store, mounter, tmp_path):
    """Listing a per-rank and two Hugging Face checkpoints (real torch 2.14 saves) indexes
    each with one GET per metadata file; a remount reuses the three indexes."""
    put_dir(store, os.path.join(TORCH2_FIX, "per_rank_meta"), "pr/step")
    put_dir(store, os.path.join(TORCH2_FIX, "hf"), "hf/model")
    put_dir(store, os.path.join(TORCH2_FIX, "hf"), "bare/model",
            skip=("model.safetensors.index.json",))
    # metadata files: 2 __R.metadata; index json + 2 shards; 2 shards
    gets = {"pr/step": 2, "hf/model": 3, "bare/model": 2}
    cache = str(tmp_path / "cache")
    m = mounter(store, "--cache-dir", cache, "--attr-timeout", "30", cache_dir=False)
    for n, (prefix, want) in enumerate(gets.items(), 1):
        os.listdir(m.p(prefix.split("/")[0]))  # the parent: nothing to index there
        before = requests(m.stats())
        names = os.listdir(m.p(prefix))
        assert ".metadata" not in names
        ix = harness.wait_index(m, "ready", n)
        assert ix["built"] == n and ix["failed"] == 0, (prefix, ix)
        if isinstance(store, harness.S3Store):  # a listing, then the build: no HEAD, no LIST
            got = requests(m.stats())
            assert {k: got[k] - before[k] for k in got} == {
                "get_requests": want, "head_requests": 0, "list_requests": 1}, (prefix, got)
    m.close()
    out = subprocess.run([harness.admin_bin(), "index", "ls", "--cache-dir", cache, "--json"],
                         check=True, capture_output=True, text=True)
    keys = sorted(c["key"].rsplit("/", 2)[-2] for c in json.loads(out.stdout)["checkpoints"])
    assert keys == ["bare", "hf", "pr"], keys

    m2 = mounter(store, "--cache-dir", cache, cache_dir=False)
    for prefix in gets:
        os.listdir(m2.p(prefix))
    ix = harness.wait_index(m2, "ready", 3)
    assert ix["reused"] == 3 and ix["built"] == 0, ix


def test_admin_index_of_per_rank_and_hugging_face_checkpoints_is_reused(store, mounter,
                                                                       tmp_path):
    """ckptfs-admin index rebuild records the mount's fingerprint (of every metadata file:
    both __R.metadata, the index json and both shards), so a mount reuses its indexes
    (it fingerprinted one file of each and the mount rebuilt them)."""
    put_dir(store, os.path.join(TORCH2_FIX, "per_rank_meta"), "pr/step")
    put_dir(store, os.path.join(TORCH2_FIX, "hf"), "hf/model")
    put_dir(store, os.path.join(TORCH2_FIX, "hf"), "bare/model",
            skip=("model.safetensors.index.json",))
    cache = str(tmp_path / "cache")
    for prefix in ("pr/step", "hf/model", "bare/model"):
        out = subprocess.run([harness.admin_bin(), "index", "rebuild", f"{store.url}/{prefix}",
                              *store.mount_args(), "--cache-dir", cache, "--json", "-q"],
                             capture_output=True, text=True,
                             env={**os.environ, **store.mount_env()}, timeout=120)
        assert out.returncode == 0, out.stderr
        assert len(json.loads(out.stdout)["checkpoints"]) == 1, out.stdout
    m = mounter(store, "--cache-dir", cache, cache_dir=False)
    for prefix in ("pr/step", "hf/model", "bare/model"):
        os.listdir(m.p(prefix))
    ix = harness.wait_index(m, "ready", 3)
    assert ix["reused"] == 3 and ix["built"] == 0, ix


def test_changed_rank_metadata_rebuilds(store, mounter, tmp_path):
    """A new version of one __R.metadata is a new version of the checkpoint's index."""
    src = os.path.join(TORCH2_FIX, "per_rank_meta")
    put_dir(store, src, "pr/step")
    cache = str(tmp_path / "cache")
    m = mounter(store, "--cache-dir", cache, "--attr-timeout", "0.2", cache_dir=False)
    os.listdir(m.p("pr/step"))
    harness.wait_index(m, "built", 1)
    # rank 1's metadata replaced by rank 0's (a valid one, other bytes): merged, the
    # checkpoint has rank 0's items twice over, so it still indexes
    store.put("pr/step/__1.metadata", open(os.path.join(src, "__0.metadata"), "rb").read())
    time.sleep(2.5)  # past --attr-timeout and the 2 s a load keeps a checkpoint's listing
    os.listdir(m.p("pr/step"))
    ix = harness.wait_index(m, "built", 2)
    assert ix["failed"] == 0 and ix["ready"] == 1, ix
    m.close()
    m2 = mounter(store, "--cache-dir", cache, cache_dir=False)
    os.listdir(m2.p("pr/step"))
    ix = harness.wait_index(m2, "ready", 1)
    assert ix["reused"] == 1 and ix["built"] == 0, ix  # the new version was stored


def put_chunked_checkpoint(store, kind, request):
    """The per_rank or hf checkpoint put under run/ckpt: (its source folder, where one
    tensor's chunk is: {"file", "offset", "length"})."""
    src = request.getfixturevalue(f"{kind}_checkpoint")
    put_dir(store, src, "run/ckpt")
    fqn = "layers.1.mlp.up.weight" if kind == "per_rank" else "layers.2.w1"
    return src, where(src, fqn)[0]


@pytest.mark.parametrize("kind", ["per_rank", "hf"])
def test_read_inside_an_item_of_a_per_rank_or_hf_checkpoint(store, mounter, kind, request):
    if store.kind == "dir":
        pytest.skip("the local store hands its files to the kernel (splice): nothing to prefetch")
    src, chunk = put_chunked_checkpoint(store, kind, request)
    size = os.path.getsize(os.path.join(src, chunk["file"]))
    m = mounter(store)
    assert ".metadata" not in os.listdir(m.p("run/ckpt"))
    harness.wait_index(m, "ready", 1)
    before = m.stats()["get_bytes"]
    with open(m.p(f"run/ckpt/{chunk['file']}"), "rb", buffering=0) as f:
        got = os.pread(f.fileno(), 4096, chunk["offset"] + 100)
    with open(os.path.join(src, chunk["file"]), "rb") as f:
        f.seek(chunk["offset"] + 100)
        assert got == f.read(4096)
    time.sleep(0.5 * harness.slow_factor())  # the item's background fetches end
    st = m.stats()
    fetched = st["get_bytes"] - before
    assert st["index"]["item_prefetches"] >= 1, st["index"]
    assert fetched >= chunk["length"], (fetched, chunk)  # the whole item ...
    assert fetched <= chunk["length"] + 2 * MiB, (fetched, chunk)  # ... in 1 MiB blocks
    assert fetched < size / 2  # not the file


@pytest.mark.parametrize("kind", ["per_rank", "hf"])
def test_a_checkpoint_listed_on_the_way_is_indexed_at_its_first_lookup(store, mounter, kind,
                                                                      request):
    """S3 lists the root with every key below it: run/ and run/ckpt/ come listed whole on
    the way (no LIST of their own), and the index notices run/ckpt by the files that
    listing saw (__R.metadata, or Hugging Face's) when a lookup there first uses it, as
    it would had the lookup listed it: a read inside an item then fetches the item."""
    if store.kind == "dir":
        pytest.skip("the local store lists one directory at a time")
    src, chunk = put_chunked_checkpoint(store, kind, request)
    m = mounter(store)
    os.stat(m.p(f"run/ckpt/{chunk['file']}"))  # lookups only: no readdir
    harness.wait_index(m, "ready", 1)
    assert m.stats()["list_requests"] == 2, m.stats()  # the bucket check and the root
    with open(m.p(f"run/ckpt/{chunk['file']}"), "rb", buffering=0) as f:
        os.pread(f.fileno(), 4096, chunk["offset"] + 100)
    assert m.stats()["index"]["item_prefetches"] >= 1, m.stats()["index"]


def test_rank_metadata_written_through_the_mount_are_indexed(store, mounter, tmp_path):
    """__R.metadata published by this mount join the set it indexes (no listing needed);
    the index holds both ranks' files, and a remount's listing finds it up to date."""
    src = os.path.join(TORCH2_FIX, "per_rank_meta")
    cache = str(tmp_path / "cache")
    m = mounter(store, "--cache-dir", cache, cache_dir=False)
    os.makedirs(m.p("pr/step"))
    for name in ("__0_0.distcp", "__1_0.distcp", "__0.metadata", "__1.metadata"):
        with open(os.path.join(src, name), "rb") as f, open(m.p(f"pr/step/{name}"), "wb") as g:
            g.write(f.read())
    m.sync("pr/step")  # both published: the set's last version is noticed
    ix = harness.wait_index(m, "ready", 1)  # (a version noticed anew is not ready until built)
    assert 1 <= ix["built"] <= 2 and ix["failed"] == 0, ix  # rank 0's, then both; or both
    m.close()
    out = subprocess.run([harness.admin_bin(), "index", "ls", "--cache-dir", cache, "--json"],
                         check=True, capture_output=True, text=True)
    ckpts = json.loads(out.stdout)["checkpoints"]
    assert [c["files"] for c in ckpts] == [2], ckpts

    m2 = mounter(store, "--cache-dir", cache, cache_dir=False)
    os.listdir(m2.p("pr/step"))
    ix = harness.wait_index(m2, "ready", 1)
    assert ix["reused"] == 1 and ix["built"] == 0, ix
