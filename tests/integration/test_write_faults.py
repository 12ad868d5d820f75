"""Faults on the write path (S3 store, through the fault proxy, which also checks every
request's SigV4 signature, payload hash included): 503 SlowDown, 500, connection resets,
answers cut or stalled after the server acted, and a CompleteMultipartUpload answered
"200 OK" with an <Error> body. Every file arrives byte-exact, or the error is reported
(docs/semantics.md §9) and the staged data is kept for the next attempt.
"""

import errno
import os
import time

import pytest

import harness
from faultproxy import Always, RandomFaults, passthrough
from harness import MiB


def is_write(req):
    return req.method in ("PUT", "POST")


def is_complete(req):
    return req.method == "POST" and "uploadId=" in req.query


class Policies:
    """The first policy that injects something wins."""

    def __init__(self, *policies):
        self.policies = policies

    def __call__(self, req):
        for p in self.policies:
            action = p(req)
            if action != "pass":
                return action
        return "pass"


def checked_store(srv, faultproxy, name, **kw):
    proxy = faultproxy(srv.port, credentials=(harness.S3_KEY, harness.S3_SECRET), **kw)
    return harness.S3Store(srv, harness.unique_prefix(name)), proxy


FILES = {  # sizes around the 5 MiB part: one PUT, and multipart uploads of 3 and 5 parts
    "f/small.bin": 300_001,
    "f/edge.bin": 5 * MiB - 1,
    "f/three.bin": 12 * MiB + 5,
    "f/five.bin": 23 * MiB + 77,
}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_upload_faults_are_retried_and_bytes_arrive_exact(dedicated_s3server, faultproxy,
                                                         mounter, seed, request):
    srv = dedicated_s3server
    store, proxy = checked_store(srv, faultproxy, request.node.name, stall_seconds=20)
    proxy.set_policy(Policies(
        Always("200err", match=is_complete, limit=2, first_attempt_only=True),
        RandomFaults({"503": 0.15, "500": 0.1, "reset": 0.1, "cut": 0.1, "stall": 0.05},
                     seed=seed, first=["503", "reset", "cut"], match=is_write)))
    mnt = mounter(store, "--part-size", "5M", "--timeout", "2", endpoint=proxy.endpoint)
    want = {k: harness.data(n, seed=seed * 100 + i) for i, (k, n) in enumerate(FILES.items())}
    os.makedirs(mnt.p("f"), exist_ok=True)
    for k, b in want.items():
        with open(mnt.p(k), "wb") as f:
            for off in range(0, len(b), MiB):
                f.write(b[off:off + MiB])
    mnt.sync_until_ok(timeout=300)  # a completion the store botched is started over
    for k, b in want.items():
        assert store.get(k) == b, f"{k} differs on the store"
    injected = {a: n for a, n in proxy.summary().items() if a != "pass"}
    assert injected.get("503") and injected.get("200err"), injected
    assert injected.get("reset", 0) + injected.get("cut", 0) > 0, injected
    assert not proxy.rejected, f"signatures rejected: {dict(proxy.rejected)}"
    assert mnt.stats()["retries"] >= 3


def test_a_store_that_refuses_uploads_gives_eio_and_keeps_the_data(dedicated_s3server,
                                                                     faultproxy, mounter,
                                                                     request):
    """§3 §9: fsync (remote) and close report EIO; nothing is lost: once the store takes
    uploads again, the file arrives."""
    srv = dedicated_s3server
    store, proxy = checked_store(srv, faultproxy, request.node.name)
    proxy.set_policy(Always("503", match=is_write))
    mnt = mounter(store, "--retries", "1", endpoint=proxy.endpoint)
    want = harness.data(200_000, seed=9)
    fd = os.open(mnt.p("refused.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.write(fd, want)
    with pytest.raises(OSError) as e:
        harness.call_with_timeout(lambda: os.fsync(fd), 60 * harness.slow_factor(), "fsync")
    assert e.value.errno == errno.EIO
    with pytest.raises(OSError) as e:
        os.close(fd)  # close reports the failed upload too (the fd is closed all the same)
    assert e.value.errno == errno.EIO
    assert store.get("refused.bin") is None
    assert harness.read_file(mnt.p("refused.bin")) == want  # still there, staged
    proxy.set_policy(passthrough)
    mnt.sync_until_ok()
    assert store.get("refused.bin") == want
    assert mnt.stats()["write"]["upload_failures"] >= 1


def test_staged_fsync_does_not_wait_for_a_stalled_store(dedicated_s3server, faultproxy,
                                                        mounter, request):
    """§3: with --fsync=staged, fsync returns once the data is durable locally, even
    while every upload hangs; remote fsync would wait."""
    srv = dedicated_s3server
    store, proxy = checked_store(srv, faultproxy, request.node.name, stall_seconds=8)
    proxy.set_policy(Always("stall", match=is_write, limit=1))
    mnt = mounter(store, "--fsync=staged", "--timeout", "30", endpoint=proxy.endpoint)
    want = harness.data(100_000, seed=10)
    fd = os.open(mnt.p("staged.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.write(fd, want)
        t0 = time.monotonic()
        os.fsync(fd)
        took = time.monotonic() - t0
    finally:
        os.close(fd)
    assert took < 3, f"staged fsync took {took:.1f} s while the store stalled"
    mnt.sync(timeout=120)
    assert store.get("staged.bin") == want


def test_a_slow_server_side_copy_is_waited_for(dedicated_s3server, faultproxy, mounter):
    """§9: a server-side copy (rename of a stored object) or a completion may take minutes
    on a large object, the server keeping the answer alive meanwhile: it is not cut off
    by the per-attempt limit (4 x --timeout), only by silence (--timeout)."""
    store, proxy = checked_store(dedicated_s3server, faultproxy, "slowcopy",
                                 trickle_bytes=16, trickle_seconds=0.5)
    want = harness.data(100_000, seed=5)
    store.put("c/src.bin", want)
    m = mounter(store, "--timeout", "1", endpoint=proxy.endpoint)
    assert os.stat(m.p("c/src.bin")).st_size == len(want)
    # The copy's answer (about 250 bytes) comes 16 bytes every 0.5 s: some 8 s in all,
    # never 1 s of silence.
    proxy.set_policy(Always("trickle", match=lambda r: "x-amz-copy-source" in r.headers))
    t = time.monotonic()
    os.rename(m.p("c/src.bin"), m.p("c/dst.bin"))
    elapsed = time.monotonic() - t
    assert elapsed > 4, f"the copy was not slowed ({elapsed:.1f} s): {proxy.summary()}"
    proxy.set_policy(passthrough)
    assert store.get("c/dst.bin") == want
    assert store.get("c/src.bin") is None


def test_a_silent_completion_is_waited_for(dedicated_s3server, faultproxy, mounter):
    """§9: a server may say nothing while it assembles a large object (s3rver concatenates
    the parts before it answers, over 10 s for 1 GiB in a loaded run): the completion is
    not cut off by --timeout's silence, and not sent again while the first one works."""
    store, proxy = checked_store(dedicated_s3server, faultproxy, "silentcomplete")

    def slow_complete(req):
        if is_complete(req):
            time.sleep(3)  # three times --timeout without a byte
        return "pass"

    proxy.set_policy(slow_complete)
    mnt = mounter(store, "--part-size", "5M", "--timeout", "1", endpoint=proxy.endpoint)
    want = harness.data(12 * MiB + 5, seed=43)
    with open(mnt.p("silent.bin"), "wb") as f:
        f.write(want)
    mnt.sync(timeout=120)  # EIO when the completion was cut off and retried in vain
    assert store.get("silent.bin") == want
    completes = [e for e in proxy.log if "uploadId=" in e[1] and e[1].startswith("POST")]
    assert len(completes) == 1, completes


def is_create(req):
    return req.method == "POST" and "uploads" in req.query and "uploadId=" not in req.query


def test_a_create_whose_answer_was_cut_leaves_no_upload_behind(rgw_store, faultproxy, mounter):
    """CreateMultipartUpload reached the store and its answer was cut: the client's retry
    begins a second upload, and the first one used to stay on the store, parts and all,
    until a crash recovery swept the key. It is aborted once the file is complete (§9).
    radosgw: s3rver cannot list multipart uploads."""
    proxy = faultproxy(rgw_store.server.port, policy=Always("cut", match=is_create, limit=1))
    mnt = mounter(rgw_store, "--part-size", "5M", endpoint=proxy.endpoint)
    want = harness.data(12 * MiB + 5, seed=41)
    with open(mnt.p("lost-answer.bin"), "wb") as f:
        f.write(want)
    mnt.sync_until_ok(timeout=120)
    assert rgw_store.get("lost-answer.bin") == want
    assert proxy.summary().get("cut") == 1, proxy.summary()
    assert not rgw_store.uploads(), f"multipart uploads left behind: {rgw_store.uploads()}"
