"""tests/integration/test_torch2_partial.py - partial loads of torch 2.x checkpoints fetch
what they need (issue #21, item 4).

A torch 2.x checkpoint saved by 4 gloo ranks in the chroot (tools/bench/torch2-partial's
worker: an embedding and 4 layers of a 512-wide model, plain tensors, which torch 2.x
spreads over the ranks' files: items of 3 KiB to 8 MiB, 58 MB), put on s3rver, loaded
through a fresh mount by 4 ranks that load only one layer (a state dict with just its
keys). The daemon counts the bytes it fetched (get_bytes); the bytes needed are the
stored lengths of the layer's items (.metadata). Checked: fetched <= 1.15x needed
(the kernel's readahead varies the ratio by ~0.07 run to run, see the test).

Two layouts of the layer are loaded: layer 1 (its items follow other layers' norms in
two files: a torch 2.14 load fetched the next layer's 4 MiB tensor because another
rank's read of the page cache made the kernel's next read look like a jump) and layer 2
(its norms sit in the first page of the next layer's tensors).

The mount uses --kernel-readahead 256K: at the 1 MiB default the kernel continues each
of Python's 128 KiB buffered reads at an item's end with a 1 MiB readahead into the next
item, which ckptfs must fetch to answer (docs/bench-load.md, "torch 2.x partial loads").
"""
import json
import os
import subprocess

import pytest

import harness

BENCH = os.path.join(harness.REPO_ROOT, "tools", "bench", "torch2-partial")
SHAPE = ["--world", "4", "--layers", "4"]


@pytest.fixture(scope="module")
def saved(torch2, tmp_path_factory):
    """The checkpoint, saved once per torch version on the chroot's local disk."""
    w = torch2.inside_copy(BENCH)
    src = os.path.join(torch2.workdir("t2partial-save"), "ck")
    r = torch2.run([w, "worker", "save", torch2.inside(src), *SHAPE], timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = subprocess.run([harness.admin_bin(), "dump", src], check=True, capture_output=True,
                         text=True)
    return w, src, json.loads(out.stdout)["storage"]


@pytest.mark.parametrize("layer", ["layers.1.", "layers.2."])
def test_partial_load_fetches_what_it_needs(s3server, chroot_mounter, torch2, saved, request,
                                            layer):
    w, src, storage = saved
    # The kernel's readahead after other ranks' reads lands in the next item now and then:
    # 1.05-1.12x run to run after the fix (1.105x for layer 2 on both versions in a loaded
    # clean-clone run). Before the fix: 1.51x (2.6, layer 1) and 1.18x (2.14, layer 2), which
    # this bound still catches; the 1.10x target of the benchmark is not a per-run bound.
    bound = 1.15
    store = harness.S3Store(s3server, harness.unique_prefix(request.node.name))
    store.put_many([(f"ck/{f}", os.path.join(src, f)) for f in sorted(os.listdir(src))])
    m = chroot_mounter(store, "--kernel-readahead", "256K")
    r = torch2.run([w, "worker", "load", torch2.inside(m.p("ck")), *SHAPE, "--only", layer],
                   timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    st = m.stats()
    need = sum(s["length"] for s in storage if s["fqn"].startswith(layer))
    fetched = st["get_bytes"] - os.path.getsize(os.path.join(src, ".metadata"))
    print(f"\ntorch {torch2.version} {layer} fetched/needed {fetched / need:.3f} "
          f"({fetched} of {need} bytes)")
    assert fetched <= bound * need, (fetched / need, fetched, need, st["cache"])
