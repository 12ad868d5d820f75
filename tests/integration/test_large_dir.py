"""tests/integration/test_large_dir.py - lookups in a checkpoint directory larger than one
LIST page: ski rental (docs/design.md, "Request budget").

A per-item DCP checkpoint of 100 ranks x 12 tensors (1,200 shard files + .metadata: 1,201
keys, two LIST pages) is put once on s3rver. On a fresh mount, after .metadata is read and
indexed, each open of a shard file the first listing page did not report sends one HEAD,
until those HEADs have cost what listing the directory whole costs (10 per page: 20); the
next open lists it whole (2 pages), and later lookups ask nothing. A mount that opens few
files (one of 1,024 nodes) never lists it; one that opens many (one of 4) lists it once.
The index build lists nothing. A missing name is a HEAD's 404, cached for --attr-timeout;
readdir still lists every name. Requests are the daemon's own counters (the stats xattr).

S3 only: on the local store a listing and a stat are syscalls, not billed requests.
The mounts use --attr-timeout 60 so that no mark or entry expires during a test on a
loaded machine (no timed assertion); the 2 s a load keeps listings is covered by
test_request_budget.
"""

import os
import sys
import time

import pytest

import harness

sys.path.insert(0, os.path.join(harness.REPO_ROOT, "tools", "lib"))
import dcp_sim  # noqa: E402

RANKS, TENSORS, ITEM = 100, 12, 16
KEYS = RANKS * TENSORS + 1  # the shards and .metadata
PAGE = 1000                 # keys per LIST page (S3's and s3rver's default)
PRICE = 10 * -(-KEYS // PAGE)  # what listing it whole costs, in HEADs: 10 per page
CKPT = "ck"


@pytest.fixture(scope="module")
def big(s3server):
    """(store, sim): the checkpoint under CKPT on a prefix of its own."""
    sim = dcp_sim.build(RANKS, TENSORS, "per-item", ITEM)
    store = harness.S3Store(s3server, harness.unique_prefix("large-dir"))
    items = [(f"{CKPT}/.metadata", sim.metadata)]
    for r, w in sim.writes.items():
        for rel, its in w:
            items.append((f"{CKPT}/{rel}", b"".join(dcp_sim.item_data(r, i, ITEM) for _, i in its)))
    store.put_many(items, workers=16)
    return store, sim


def requests(m):
    s = m.stats()
    return {"get": s["get_requests"], "head": s["head_requests"], "list": s["list_requests"]}


def delta(a, b):
    return {k: b[k] - a[k] for k in a}


def metadata_read(mounter, store, sim, attr="60"):
    """A fresh mount that has read ck/.metadata and indexed it (so the directory's size
    is known: the files its .metadata names)."""
    m = mounter(store, "--attr-timeout", attr)
    with open(m.p(f"{CKPT}/.metadata"), "rb") as f:
        assert f.read() == sim.metadata
    harness.wait_index(m, "ready", 1)
    return m


def last_files(sim, n):
    """n shard files from the end of key order: none is on the first listing page."""
    assert n <= KEYS - PAGE
    return sorted(rel for rel, _, _ in sim.files)[-n:]


def read(m, rel, sim):
    with open(m.p(f"{CKPT}/{rel}"), "rb") as f:
        assert len(f.read()) == ITEM * (1 if sim.layout == "per-item" else TENSORS), rel


def test_a_fresh_mount_reads_metadata_with_one_page_and_the_index_lists_nothing(mounter, big):
    """Mount (1 LIST: the bucket check), the path walk (the root's first page: it is large
    too; ck by name: a HEAD's 404 and the one-page directory probe), ck's first page
    (which has .metadata: no HEAD for it), then 2 GETs of .metadata (the ranks' and the
    index build's) and nothing else: before, the index build listed ck whole (2 pages),
    and the first lookup in ck did too."""
    store, sim = big
    m = metadata_read(mounter, store, sim)
    assert requests(m) == {"get": 2, "head": 1, "list": 4}, requests(m)
    ix = m.stats()["index"]
    assert ix["built"] == 1 and ix["failed"] == 0, ix


@pytest.mark.parametrize("opened", [12, 150])
def test_opens_in_a_large_checkpoint_send_heads_until_a_listing_is_cheaper(mounter, big,
                                                                            opened):
    """opened 12: a mount of a 1,024-node load (12 of 1,200 files): a HEAD per file, never
    a listing. opened 150: a mount of a few-node load: PRICE HEADs, then one whole listing
    (2 pages) answers the rest, and a missing name too. (The files come from past the
    first page, which answers for the 999 files it has.)"""
    store, sim = big
    m = metadata_read(mounter, store, sim)
    names = last_files(sim, opened)
    before = requests(m)
    for n, rel in enumerate(names, 1):
        read(m, rel, sim)
        got = delta(before, requests(m))
        heads = min(n, PRICE)
        pages = 0 if n <= PRICE else -(-KEYS // PAGE)
        assert got == {"get": n, "head": heads, "list": pages}, (n, rel, got)
    now = requests(m)
    assert not os.path.exists(m.p(f"{CKPT}/__no_such_rank_0.distcp"))
    missing = delta(now, requests(m))
    if opened > PRICE:  # listed whole: the listing answers
        assert missing == {"get": 0, "head": 0, "list": 0}, missing
    else:  # asked by name: a HEAD's 404 and the directory probe (a LIST page)
        assert missing == {"get": 0, "head": 1, "list": 1}, missing


def test_the_rent_outlives_the_mark(mounter, big):
    """A GET on a busy store can outlast the 2 s a load keeps a large directory's mark:
    the next lookup lists the first page again, and the HEADs sent before still count
    (16 mounts of a 1,024-rank load on 2 cores: one mount sent 255 HEADs, twice the
    price, when they did not). The sleep only makes sure the mark expired (past
    --attr-timeout 0.05 and the 2 s linger); nothing is asserted about time."""
    store, sim = big
    m = metadata_read(mounter, store, sim, attr="0.05")
    names = last_files(sim, PRICE + 1)
    half = PRICE // 2
    before = requests(m)
    for rel in names[:half]:
        read(m, rel, sim)
    assert delta(before, requests(m)) == {"get": half, "head": half, "list": 0}
    time.sleep(2.5)
    os.stat(m.p(CKPT))  # the path walk again (the root's page, ck by name): not ck's rent
    mid = requests(m)
    for rel in names[half:PRICE]:
        read(m, rel, sim)
    got = delta(mid, requests(m))
    assert got == {"get": PRICE - half, "head": PRICE - half, "list": 1}, got  # 1: the first page
    read(m, names[PRICE], sim)  # the rent is paid: a whole listing, no HEAD
    got = delta(mid, requests(m))
    assert got == {"get": PRICE - half + 1, "head": PRICE - half, "list": 1 + -(-KEYS // PAGE)}, got


def test_a_missing_name_in_a_large_directory_is_a_cached_404(mounter, big):
    """Before the listing: a name that is not there is the store's answer to a HEAD (and
    the probe that tells it is no directory), cached for --attr-timeout like any lookup,
    so a second look asks nothing; a name nobody looked up is asked for by name (no
    listing says it is absent), so a file another node added is seen at once."""
    store, sim = big
    m = metadata_read(mounter, store, sim)
    before = requests(m)
    p = m.p(f"{CKPT}/late.distcp")
    assert not os.path.exists(p)
    assert delta(before, requests(m)) == {"get": 0, "head": 1, "list": 1}
    assert not os.path.exists(p)
    assert delta(before, requests(m)) == {"get": 0, "head": 1, "list": 1}, "asked twice"
    store.put(f"{CKPT}/later.distcp", b"x" * 5)
    try:
        assert os.path.getsize(m.p(f"{CKPT}/later.distcp")) == 5, "a name added is asked for"
        assert delta(before, requests(m)) == {"get": 0, "head": 2, "list": 1}
    finally:
        store.delete(f"{CKPT}/later.distcp")


def test_readdir_of_a_large_checkpoint_lists_every_name(mounter, big):
    store, sim = big
    m = metadata_read(mounter, store, sim)
    names = os.listdir(m.p(CKPT))
    assert len(names) == KEYS
    assert set(names) == {".metadata"} | {rel for rel, _, _ in sim.files}
