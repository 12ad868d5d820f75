"""tests/integration/test_stats.py - `ckptfs-admin stats` and the daemon's transfer log.

Run:  /usr/bin/python3 -m pytest tests/integration/test_stats.py
Env:  CKPTFS_ADMIN  the admin binary (default build/tools/admin/ckptfs-admin)

* `stats --json` is the daemon's stats object; after a read its byte and request
  counters have moved by what was read (both stores), the cache's too (S3)
* the human summary shows the same numbers
* `--watch --count N` prints N lines of rates, which are non-zero while a read runs
* `stats` on a directory that is not a mount root fails with exit 4
* the daemon logs one "transfers in" info line per --stats-interval while data moves,
  and none while the mount is idle
"""
import json
import os
import re
import subprocess
import threading
import time

import pytest

import harness
from harness import MiB

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
ADMIN = harness.admin_bin()

if not os.path.exists(ADMIN):
    pytest.skip("ckptfs-admin not built at %s (set CKPTFS_ADMIN)" % ADMIN, allow_module_level=True)


def admin(*args, ok=(0,), timeout=60):
    p = subprocess.run([ADMIN, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    assert p.returncode in ok, "exit %d for %s\nstdout: %s\nstderr: %s" % (
        p.returncode, args, p.stdout[-2000:], p.stderr[-2000:])
    return p


def stats(mnt):
    return json.loads(admin("stats", mnt.path, "--json").stdout)


def test_stats_counters_move_with_a_read(store, mounter):
    size = 6 * MiB + 12345
    store.put("ckpt/a.bin", harness.data(size, 1))
    mnt = mounter(store)
    before = stats(mnt)
    assert before["read_bytes"] == 0 and before["get_bytes"] == 0
    for key in ("prefetched_bytes", "prefetch_unused_bytes", "prefetch_unread_bytes"):
        assert key in before["cache"]
    assert "write" in before and "index" in before

    digest, n = harness.sha256_file(os.path.join(mnt.path, "ckpt/a.bin"))
    assert n == size and digest == harness.sha256(harness.data(size, 1))
    after = stats(mnt)
    assert after["read_bytes"] - before["read_bytes"] == size
    assert after["get_bytes"] - before["get_bytes"] >= size
    assert after["get_requests"] > before["get_requests"]
    assert after["opens"] == before["opens"] + 1
    if isinstance(store, harness.S3Store):  # the dir store hands reads to the kernel (splice)
        c = after["cache"]
        assert c["hits"] + c["misses"] + c["shared"] > 0
        assert c["prefetched_bytes"] > 0, c

    human = admin("stats", mnt.path).stdout
    m = re.search(r"read by clients .*\((\d+) B\)", human)
    assert m and int(m.group(1)) == size, human
    m = re.search(r"fetched from the store .*\((\d+) B\) in (\d+) GETs", human)
    assert m, human
    now = stats(mnt)  # the human run came between: compare with a fresh sample
    assert int(m.group(1)) == now["get_bytes"] and int(m.group(2)) == now["get_requests"], human
    assert re.search(r"GET %d, HEAD \d+, LIST \d+" % now["get_requests"], human), human
    assert "prefetched never used" in human and "index" in human and "write" in human


def test_stats_count_the_keys_listings_returned(s3server, mounter, request):
    """listed_keys counts the keys (and common prefixes) of every LIST page: what a
    listing cost the store beyond its request (a page of 1,000 keys is not one of 5)."""
    store = harness.S3Store(s3server, harness.unique_prefix(request.node.name))
    store.put_many([(f"ckpt/f{i}", b"x") for i in range(5)] + [(f"other/g{i}", b"y")
                                                              for i in range(3)])
    mnt = mounter(store)
    before = stats(mnt)
    assert sorted(os.listdir(mnt.p("ckpt"))) == [f"f{i}" for i in range(5)]
    after = stats(mnt)
    # readdir: one listing of ckpt, its 5 keys (the root was listed when `stats` looked
    # the mount up: all 8 keys below it, for its time)
    assert before["listed_keys"] >= 8, before
    assert after["list_requests"] - before["list_requests"] == 1, (before, after)
    assert after["listed_keys"] - before["listed_keys"] == 5, (before, after)
    human = admin("stats", mnt.path).stdout
    assert re.search(r"^  %d keys listed, " % stats(mnt)["listed_keys"], human, re.M), human


def test_stats_watch_shows_rates_while_reading(s3server, mounter, request):
    store = harness.S3Store(s3server, harness.unique_prefix(request.node.name))
    size = 48 * MiB
    store.put("big.bin", harness.data(size, 2))
    mnt = mounter(store)
    stop = threading.Event()

    def reader():  # keep data moving for the whole watch
        while not stop.is_set():
            with open(os.path.join(mnt.path, "big.bin"), "rb") as f:
                while f.read(MiB) and not stop.is_set():
                    time.sleep(0.01)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        out = admin("stats", mnt.path, "--watch", "0.3", "--count", "4", "--json").stdout
        human = admin("stats", mnt.path, "--watch", "0.3", "--count", "2").stdout
    finally:
        stop.set()
        t.join(30)
    lines = [json.loads(l) for l in out.splitlines()]
    assert len(lines) == 4, out
    for l in lines:
        assert 0.2 < l["interval_s"] < 5 and "read_bytes" in l["rates"] and "stats" in l
    assert max(l["rates"]["read_bytes"] for l in lines) > 0, out
    rows = human.splitlines()
    assert rows[0].split()[:3] == ["time", "read", "MB/s"] and len(rows) == 3, human


def test_stats_of_a_plain_directory_fails(tmp_path):
    p = admin("stats", tmp_path, ok=(4,))
    assert "not the root of a ckptfs mount" in p.stderr
    p = admin("stats", tmp_path, "--json", ok=(4,))
    assert "error" in json.loads(p.stdout)
    admin("stats", ok=(2,))
    admin("stats", tmp_path, "--watch", "0", ok=(2,))


def transfer_lines(mnt):
    with open(mnt.logpath, encoding="utf-8", errors="replace") as f:
        return [l for l in f if " info: transfers in " in l]


def test_transfer_log_while_reading_and_silent_when_idle(s3server, mounter, request):
    store = harness.S3Store(s3server, harness.unique_prefix(request.node.name))
    size = 8 * MiB
    store.put("x.bin", harness.data(size, 3))
    mnt = mounter(store, "--stats-interval", "0.4")
    time.sleep(1.0)
    assert transfer_lines(mnt) == [], "a line while nothing was read"
    harness.read_file(os.path.join(mnt.path, "x.bin"))
    # Wait until the lines stop (readahead may still be landing after the read).
    deadline = time.monotonic() + 10
    lines, quiet_since = [], time.monotonic()
    while time.monotonic() < deadline:
        now = transfer_lines(mnt)
        if now != lines:
            lines, quiet_since = now, time.monotonic()
        elif lines and time.monotonic() - quiet_since > 1.0:
            break
        time.sleep(0.1)
    assert lines, "no transfer line after a read:\n" + harness.tail(mnt.logpath)
    got = 0
    for l in lines:
        m = re.search(r"read [\d.]+ MB/s \(([\d.]+) (B|KiB|MiB)\), fetched [\d.]+ MB/s .* in (\d+) "
                      r"GETs", l)
        assert m, l
        got += float(m.group(1)) * {"B": 1, "KiB": 1024, "MiB": MiB}[m.group(2)]
    assert abs(got - size) < 0.01 * size, lines
    time.sleep(1.2)  # idle: three more intervals without a line
    assert transfer_lines(mnt) == lines, "lines while idle"
