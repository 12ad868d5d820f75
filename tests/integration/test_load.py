"""tests/integration/test_load.py - real DCP loads fetch what they need, once.

Real torch 1.13 DCP checkpoints (4 ranks, 4 layers of 4 matrices, items of 0.5 MB per
rank, an optimizer state per matrix after the model, and a plain tensor of 2 MB that
rank 0 saves and every rank loads) on s3rver, loaded through one cold mount by real
ranks (gloo). The daemon counts the bytes it fetched from the store (get_bytes); the
bytes a load needs are the items of the keys it loads, from .metadata (ckptfs-admin
dump). Checks:

- partial loads fetch at most 1.10x what they need: one layer, a contiguous range of
  layers (a pipeline stage), model only from a model+optimizer checkpoint, the same
  keys in a shuffled order, resharded loads (saved by 4 ranks, loaded by 2 and 3), in
  both layouts (one file per rank, one file per item);
- the same for a layout that is not the load order: items of four sizes saved smallest
  first, one file per rank (partial loads <= 1.10x, a full load <= 1.02x);
- ranks on one mount fetch each byte once (<= 1.02x the unique bytes needed): a full
  load by 4 ranks (all of them read the plain tensor from rank 0's file), and one
  resharded to 3 (ranks then read items of the same file);
- the first rank to enter a tensor's chunk fetches the other ranks' chunks of it
  (docs/design.md, "Cohort prefetch"), but only for ranks this mount serves: two mounts
  as two nodes (ranks 0-1 load through one, 2-3 through the other), in both layouts,
  each fetch <= 1.02x what their own ranks need.
"""
import json
import os
import subprocess

import pytest

import harness

REPO = harness.REPO_ROOT
WORKLOAD = os.path.join(REPO, "tools", "lib", "dcp_workload.py")
MiB = 1 << 20
WORLD, MB, LAYERS = 4, 32, 4  # 4 layers x 4 matrices of 2 MB: 512 KB per rank and item


def save(tmp_path_factory, name, *extra):
    d = str(tmp_path_factory.mktemp(name) / "step_1")
    subprocess.run(["/usr/bin/python3", WORKLOAD, "save", d, "--world", str(WORLD), "--mb",
                    str(MB), "--layers", str(LAYERS), *extra], check=True,
                   capture_output=True, timeout=300)
    return d


@pytest.fixture(scope="module")
def per_rank(tmp_path_factory):
    return save(tmp_path_factory, "per_rank", "--per-rank", "--optim", "--replicated")


@pytest.fixture(scope="module")
def large_items(tmp_path_factory):
    """Items of 2 MB per rank, as in a real model's layers (64 MB)."""
    d = str(tmp_path_factory.mktemp("large_items") / "step_1")
    subprocess.run(["/usr/bin/python3", WORKLOAD, "save", d, "--world", str(WORLD), "--mb",
                    "64", "--layers", "2", "--per-rank"], check=True, capture_output=True,
                   timeout=300)
    return d


@pytest.fixture(scope="module")
def size_sorted(tmp_path_factory):
    """A transformer layer's four matrix sizes and a small norm per layer (items of 8 KB
    to 2.6 MB per rank, 64 MB), saved one file per rank smallest first (as torch 2.x's
    writer orders items by size): a load in model order jumps back and forth in every
    file, and the kernel's readahead runs past every item it reads into one it may not
    need (docs/design.md, "Layouts that are not the load order")."""
    d = str(tmp_path_factory.mktemp("size_sorted") / "step_1")
    subprocess.run(["/usr/bin/python3", WORKLOAD, "save", d, "--world", str(WORLD), "--mb",
                    "64", "--layers", "2", "--per-rank", "--mixed", "--size-order"], check=True,
                   capture_output=True, timeout=300)
    return d


@pytest.fixture(scope="module")
def per_item(tmp_path_factory):
    return save(tmp_path_factory, "per_item", "--optim", "--replicated")


def storage(src):
    out = subprocess.run([harness.admin_bin(), "dump", src], check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout)["storage"]


def needed_bytes(src, only):
    """Bytes of the items a load of the keys starting with one of `only` reads."""
    prefixes = tuple(only.split(",")) if only else ("",)
    return sum(s["length"] for s in storage(src) if s["fqn"].startswith(prefixes))


def load(m, prefix, world, *extra, shape=("--mb", str(MB), "--layers", str(LAYERS), "--optim",
                                          "--replicated")):
    out = subprocess.run(["/usr/bin/python3", WORKLOAD, "load", m.p(prefix), "--world",
                          str(world), *shape, *extra], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def s3_store(s3server, name):
    return harness.S3Store(s3server, harness.unique_prefix(name))


def put_checkpoint(store, src, prefix="run/step_1"):
    store.put_many([(f"{prefix}/{f}", os.path.join(src, f)) for f in sorted(os.listdir(src))])
    return prefix


def fetched_for_load(store, mounter, src, world, only, *extra, **kw):
    """Load through a cold mount: (bytes fetched from the store, bytes needed)."""
    prefix = put_checkpoint(store, src)
    # The kernel reads up to --kernel-readahead past the last item a load wants, and all
    # of it is fetched: with the 1 MiB default that alone is 1.15-1.18x on these small
    # test checkpoints (docs/design.md). 128K keeps these tests about the prefetch rule:
    # at 256K a resharded load (two loaders per file, so two kernel streams whose
    # overshoot depends on which pages the other already brought in) measured 1.065x in
    # most runs and 1.102x in one loaded CI run.
    m = mounter(store, "--kernel-readahead", "128K")
    md = os.path.getsize(os.path.join(src, ".metadata"))
    load(m, prefix, world, *(["--only", only] if only else []), *extra, **kw)
    st = m.stats()
    # Every rank reads .metadata (once from the store: shared).
    fetched, need = st["get_bytes"] - md, needed_bytes(src, only)
    print(f"\nfetched/needed {fetched / need:.3f} ({fetched} of {need} bytes), world {world}, "
          f"keys {only or 'all'} {' '.join(extra)}")
    return fetched, need, st


ONE_LAYER = "layers.1."
STAGE = "layers.1.,layers.2."  # a contiguous range of layers
MODEL = "layers."  # model only: no optim.*

CASES = [
    pytest.param(WORLD, ONE_LAYER, (), id="one-layer"),
    pytest.param(WORLD, STAGE, (), id="layer-range"),
    pytest.param(WORLD, MODEL, (), id="model-only"),
    pytest.param(WORLD, STAGE, ("--shuffle", "7"), id="shuffled"),
    pytest.param(2, STAGE, (), id="reshard-2", marks=pytest.mark.matrix),
    pytest.param(3, STAGE, (), id="reshard-3", marks=pytest.mark.matrix),
]


@pytest.mark.parametrize("world,only,extra", CASES)
def test_partial_load_per_rank_fetches_what_it_needs(s3server, mounter, request, per_rank,
                                                     world, only, extra):
    store = s3_store(s3server, request.node.name)
    fetched, need, st = fetched_for_load(store, mounter, per_rank, world, only, *extra)
    assert st["index"]["ready"] == 1
    assert fetched <= 1.10 * need, (fetched / need, fetched, need, st["cache"])


def test_partial_load_of_large_items_fetches_what_it_needs(s3server, mounter, request,
                                                           large_items):
    """One layer of four 2 MB items per rank: the kernel's readahead streams run
    past the last item; they must not make the next item be fetched whole."""
    store = s3_store(s3server, request.node.name)
    fetched, need, st = fetched_for_load(store, mounter, large_items, WORLD, "layers.0.",
                                         shape=("--mb", "64", "--layers", "2"))
    assert fetched <= 1.10 * need, (fetched / need, fetched, need, st["cache"])


@pytest.mark.parametrize("world,only,limit", [
    pytest.param(WORLD, "layers.1.", 1.10, id="one-layer"),
    pytest.param(WORLD, "", 1.02, id="full"),
    # Two loaders per file, each jump with its own readahead overshoot, which depends
    # on what the other loader's reads brought in: 1.04-1.18x over 6 runs of three
    # builds (design.md, "Layouts that are not the load order"); whole-item guesses
    # would be 1.67x.
    pytest.param(3, "layers.0.", 1.25, id="reshard-3", marks=pytest.mark.matrix),
])
def test_load_of_a_size_sorted_layout_fetches_what_it_needs(s3server, mounter, request,
                                                            size_sorted, world, only, limit):
    """Saved smallest item first, loaded in model order: partial loads fetch <= 1.10x
    what they need, a full load each byte once."""
    store = s3_store(s3server, request.node.name)
    shape = ("--mb", "64", "--layers", "2", "--mixed")
    fetched, need, st = fetched_for_load(store, mounter, size_sorted, world, only, shape=shape)
    assert fetched <= limit * need, (fetched / need, fetched, need, st["cache"])


@pytest.mark.parametrize("world,only,extra", [
    CASES[0], CASES[2],
    pytest.param(WORLD, STAGE, ("--shuffle", "7"), id="shuffled", marks=pytest.mark.matrix),
    pytest.param(3, STAGE, (), id="reshard-3", marks=pytest.mark.matrix),
])
def test_partial_load_per_item_fetches_what_it_needs(s3server, mounter, request, per_item,
                                                     world, only, extra):
    store = s3_store(s3server, request.node.name)
    fetched, need, st = fetched_for_load(store, mounter, per_item, world, only, *extra)
    assert fetched <= 1.10 * need, (fetched / need, fetched, need, st["cache"])


@pytest.mark.parametrize("world", [WORLD, 3])
def test_ranks_on_one_mount_fetch_each_byte_once(s3server, mounter, request, per_rank, world):
    """A full load by 4 ranks on one mount (every rank reads the plain tensor in rank
    0's file); and resharded to 3 ranks, so that ranks also share sharded items (ranks
    1 and 2 both read items of the file rank 1 saved): each byte is fetched once."""
    store = s3_store(s3server, request.node.name)
    fetched, need, st = fetched_for_load(store, mounter, per_rank, world, "")
    assert fetched <= 1.02 * need, (fetched / need, fetched, need, st["cache"])
    assert st["cache"]["shared"] + st["cache"]["hits"] > 0
    if world == WORLD:  # same sharding: a rank ahead fetched the others' chunks
        assert st["index"]["sibling_prefetches"] > 0, st["index"]


def test_a_load_read_again_after_a_remount_fetches_nothing(s3server, mounter, request,
                                                           per_rank):
    """Issue #22: a load keeps every chunk it fetched in the disk cache, so the next mount's
    load of the same checkpoint fetches no byte. A per-rank file's items (512 KB here) do not
    start on the cache's 1 MiB chunks: each item's fetch cuts a chunk at its ends, and that
    chunk is kept once the fetches next to it have landed too."""
    store = s3_store(s3server, request.node.name)
    prefix = put_checkpoint(store, per_rank)
    m = mounter(store, "--disk-cache-size", "128M")
    load(m, prefix, WORLD)
    fill = m.stats()["disk_cache"]
    m.close()  # the background writer finishes first
    assert fill["fill_dropped"] == 0, fill  # 32 MB: the writer's queue holds all of it
    m2 = mounter(store, "--disk-cache-size", "128M", cache_dir=m.cache_dir)
    load(m2, prefix, WORLD)
    st = m2.stats()
    assert st["get_bytes"] == 0, (st["get_bytes"], fill, st["disk_cache"])


def rank_of(name):
    """The saving rank of a `__R_N.distcp` file."""
    return int(name[2:].split("_")[0])


@pytest.mark.parametrize("layout", ["per_rank", "per_item"])
def test_two_mounts_as_two_nodes_fetch_only_their_ranks(s3server, mounter, request, layout):
    """Ranks 0-1 load through one mount, ranks 2-3 through another (two nodes, one
    bucket). A chunk entered on one node must not make it fetch the chunks that the
    other node's ranks saved: each mount fetches only what its own ranks read (their
    shards, plus the plain tensor in rank 0's file that every rank reads)."""
    src = request.getfixturevalue(layout)
    store = s3_store(s3server, request.node.name)
    prefix = put_checkpoint(store, src)
    node = [mounter(store, "--kernel-readahead", "256K") for _ in range(2)]
    dirs = [node[r // 2].p(prefix) for r in range(WORLD)]
    load(node[0], prefix, WORLD, "--rank-dirs", ",".join(dirs))
    items = storage(src)
    savers = {}
    for s in items:
        savers.setdefault(s["fqn"], set()).add(rank_of(s["relative_path"]))
    plain = {fqn for fqn, ranks in savers.items() if len(ranks) == 1}  # every rank reads it
    for i, m in enumerate(node):
        ranks = {2 * i, 2 * i + 1}
        need = sum(s["length"] for s in items
                   if rank_of(s["relative_path"]) in ranks or s["fqn"] in plain)
        st = m.stats()
        fetched = st["get_bytes"] - os.path.getsize(os.path.join(src, ".metadata"))
        print(f"\nnode {i} (ranks {sorted(ranks)}): fetched/needed {fetched / need:.3f}, "
              f"sibling prefetches {st['index']['sibling_prefetches']}")
        assert fetched <= 1.02 * need, (i, fetched / need, fetched, need, st["cache"])
        assert st["index"]["sibling_prefetches"] > 0, st["index"]
