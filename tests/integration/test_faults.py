"""Faults between ckptfs and S3: a dead server, 503 SlowDown, connection resets, short
bodies and stalled responses (S3 store only).

The first group checks the fault proxy itself against s3rver with plain HTTP and boto3,
so a proxy bug is not mistaken for a ckptfs bug.
"""

import errno
import http.client
import mmap
import os
import socket
import time

import pytest

import harness
from faultproxy import Always, EveryNth, RandomFaults, passthrough
from harness import MiB

HANG_BOUND = 30  # seconds (times slow_factor under ASan) for "fails, does not hang"


def _get(port, target, headers=None, method="GET", conn=None, timeout=10):
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request(method, target, headers=headers or {})
    r = c.getresponse()
    return c, r


# --------------------------------------------------------------------------- the proxy


@pytest.fixture
def proxied(dedicated_s3server, faultproxy):
    srv = dedicated_s3server
    body = harness.data(3 * MiB + 17, seed=7)
    srv.client().put_object(Bucket=srv.bucket, Key="dir/obj", Body=body)
    return srv, faultproxy(srv.port), body


def test_proxy_passthrough_keepalive(proxied):
    srv, proxy, body = proxied
    target = f"/{srv.bucket}/dir/obj"
    c, r = _get(proxy.port, target)
    assert r.status == 200 and r.read() == body
    c, r = _get(proxy.port, target, {"Range": "bytes=100-199"}, conn=c)  # same connection
    assert r.status == 206 and r.read() == body[100:200]
    c, r = _get(proxy.port, target, method="HEAD", conn=c)
    r.read()
    assert r.status == 200 and int(r.getheader("Content-Length")) == len(body)
    c, r = _get(proxy.port, f"/{srv.bucket}?list-type=2&delimiter=/", conn=c)
    assert r.status == 200 and b"<Prefix>dir/</Prefix>" in r.read()
    c, r = _get(proxy.port, f"/{srv.bucket}/missing", conn=c)
    assert r.status == 404 and b"NoSuchKey" in r.read()
    c.close()
    assert proxy.summary() == {"pass": 5}
    # boto3 through the proxy: signed PUT with a body, GET back
    s3 = harness.s3_client(proxy.endpoint)
    s3.put_object(Bucket=srv.bucket, Key="viaproxy", Body=b"x" * 100000)
    assert s3.get_object(Bucket=srv.bucket, Key="viaproxy")["Body"].read() == b"x" * 100000


def test_proxy_injects_each_fault(proxied):
    srv, proxy, body = proxied
    target = f"/{srv.bucket}/dir/obj"
    # 503 SlowDown with an S3 XML body; the connection stays usable
    proxy.set_policy(Always("503", limit=1))
    c, r = _get(proxy.port, target)
    assert r.status == 503 and b"<Code>SlowDown</Code>" in r.read()
    c, r = _get(proxy.port, target, conn=c)
    assert r.status == 200 and r.read() == body
    c.close()
    # reset before any response
    proxy.set_policy(Always("reset", limit=1))
    with pytest.raises((ConnectionResetError, http.client.RemoteDisconnected)):
        _get(proxy.port, target)
    # a short body, then a reset
    proxy.set_policy(Always("cut", limit=1))
    c, r = _get(proxy.port, target)
    assert r.status == 200 and int(r.getheader("Content-Length")) == len(body)
    with pytest.raises((http.client.IncompleteRead, ConnectionResetError)):
        r.read()
    c.close()
    # a stall: head and part of the body, then silence
    proxy.stall_seconds = 3
    proxy.set_policy(Always("stall", limit=1))
    c, r = _get(proxy.port, target, timeout=1)
    with pytest.raises((socket.timeout, http.client.IncompleteRead, ConnectionResetError)):
        r.read()
    c.close()
    assert {k: v for k, v in proxy.summary().items() if k != "pass"} == {"503": 1, "reset": 1, "cut": 1, "stall": 1}


def test_proxy_first_attempt_only_lets_boto3_retry_through(proxied):
    srv, proxy, body = proxied
    proxy.set_policy(EveryNth(["503", "reset"], n=1))
    s3 = harness.s3_client(proxy.endpoint)
    got = s3.get_object(Bucket=srv.bucket, Key="dir/obj", Range="bytes=0-1048575")
    assert got["Body"].read() == body[:MiB]
    assert got["ResponseMetadata"]["RetryAttempts"] >= 1
    assert proxy.summary().get("503", 0) + proxy.summary().get("reset", 0) >= 1


SPECIAL_KEYS = ["sp ace", "plus+sign", "eq=ual&amp", "per%25cent", "uni-\u00fc\u00df-\u6587", "tilde~x",
                "semi;colon,comma", "paren(1)'q", "star*!", "dollar$@:"]


def test_proxy_sigv4_check_agrees_with_boto3(dedicated_s3server, faultproxy):
    srv = dedicated_s3server
    proxy = faultproxy(srv.port, credentials=(harness.S3_KEY, harness.S3_SECRET))
    s3 = harness.s3_client(proxy.endpoint)
    for k in SPECIAL_KEYS:
        s3.put_object(Bucket=srv.bucket, Key=f"dir/{k}", Body=k.encode())
    s3.put_object(Bucket=srv.bucket, Key="empty", Body=b"")
    for i in range(5):
        s3.put_object(Bucket=srv.bucket, Key=f"pages/{i}", Body=b"x")
    for k in SPECIAL_KEYS:
        assert s3.get_object(Bucket=srv.bucket, Key=f"dir/{k}", Range="bytes=0-3")["Body"].read() == k.encode()[:4]
        assert s3.head_object(Bucket=srv.bucket, Key=f"dir/{k}")["ContentLength"] == len(k.encode())
    got = {o["Key"] for o in s3.list_objects_v2(Bucket=srv.bucket, Prefix="dir/", Delimiter="/")["Contents"]}
    assert got == {f"dir/{k}" for k in SPECIAL_KEYS}
    # continuation tokens are base64 ('+', '/', '='): their query encoding is signed too
    keys = [o["Key"] for p in s3.get_paginator("list_objects_v2").paginate(
        Bucket=srv.bucket, Prefix="pages/", PaginationConfig={"PageSize": 2}) for o in p.get("Contents", [])]
    assert keys == [f"pages/{i}" for i in range(5)]
    assert not proxy.rejected, proxy.rejected
    # wrong secret, wrong key id, anonymous
    with pytest.raises(Exception, match="SignatureDoesNotMatch"):
        harness.s3_client(proxy.endpoint, secret="wrong").list_objects_v2(Bucket=srv.bucket)
    with pytest.raises(Exception, match="InvalidAccessKeyId"):
        harness.s3_client(proxy.endpoint, key_id="AKIDWRONG").list_objects_v2(Bucket=srv.bucket)
    c, r = _get(proxy.port, f"/{srv.bucket}/empty")
    assert r.status == 403 and b"AccessDenied" in r.read()
    assert proxy.rejected["SignatureDoesNotMatch"] >= 1 and proxy.rejected["InvalidAccessKeyId"] >= 1
    assert proxy.rejected["AccessDenied"] == 1


# --------------------------------------------------------------------------- ckptfs


FILES = {"small.bin": 3 * MiB + 123, "mid.bin": 8 * MiB + 1, "large.bin": 32 * MiB}


@pytest.fixture
def fault_store(dedicated_s3server):
    """The dedicated server's bucket root (s3://faults) with FILES in it."""
    store = harness.S3Store(dedicated_s3server)
    content = {name: harness.data(size, seed=i + 100) for i, (name, size) in enumerate(FILES.items())}
    store.put_many(content.items(), workers=3)
    return store, content


def _read_all_exact(mnt, content, bound):
    for name, want in content.items():
        got = harness.call_with_timeout(lambda: harness.read_file(mnt.p(name)), bound, f"read {name}")
        assert len(got) == len(want), f"{name}: read {len(got)} bytes, want {len(want)}"
        assert got == want, f"{name}: bytes differ (first difference at {_first_diff(got, want)})"


def _first_diff(a, b):
    for i in range(0, min(len(a), len(b)), 4096):
        if a[i:i + 4096] != b[i:i + 4096]:
            for j in range(i, min(i + 4096, len(a), len(b))):
                if a[j] != b[j]:
                    return j
    return min(len(a), len(b))


def _retries(mnt):
    return harness.stat_value(mnt.stats(), "retries")


@pytest.mark.parametrize("kind", ["503", "500", "reset", "cut"])
def test_transient_faults_are_retried(kind, fault_store, faultproxy, mounter):
    store, content = fault_store
    # every 3rd request (HEAD, list and GET alike) fails once, on its first attempt
    policy = EveryNth(kind, n=3)
    proxy = faultproxy(store.server.port, policy=policy, seed=1)
    mnt = mounter(store, "--retries", "5", "--timeout", "5", endpoint=proxy.endpoint)
    _read_all_exact(mnt, content, HANG_BOUND * harness.slow_factor())
    assert policy.injected > 0, f"no fault injected: {proxy.summary()}"
    stats = mnt.stats()
    assert harness.stat_value(stats, "errors") == 0, f"a retried fault surfaced as an error: {stats}"
    if kind != "reset":
        # (a reset before any response on a reused connection is re-sent by libcurl
        # itself, invisible to ckptfs's retry counter, so resets alone need not count)
        assert _retries(mnt) > 0, f"proxy injected {proxy.summary()}, stats {stats}"


def test_random_faults_reads_exact(fault_store, faultproxy, mounter):
    store, content = fault_store
    policy = RandomFaults({"503": 0.1, "cut": 0.1, "reset": 0.05}, seed=2024, first=["pass", "503", "pass", "cut"])
    proxy = faultproxy(store.server.port, policy=policy, seed=2024)
    mnt = mounter(store, "--retries", "5", "--timeout", "5", endpoint=proxy.endpoint)
    _read_all_exact(mnt, content, HANG_BOUND * harness.slow_factor())
    assert policy.injected > 0, f"no fault injected: {proxy.summary()}"
    stats = mnt.stats()
    assert harness.stat_value(stats, "retries") > 0, f"proxy {proxy.summary()}, stats {stats}"
    assert harness.stat_value(stats, "errors") == 0, f"a retried fault surfaced as an error: {stats}"


def test_stalled_response_times_out_and_is_retried(fault_store, faultproxy, mounter):
    store, content = fault_store
    policy = EveryNth("stall", n=2, limit=2, match=lambda r: r.is_object_get())
    proxy = faultproxy(store.server.port, policy=policy, stall_seconds=60)
    mnt = mounter(store, "--retries", "3", "--timeout", "2", endpoint=proxy.endpoint)
    t = time.monotonic()
    _read_all_exact(mnt, {"mid.bin": content["mid.bin"]}, HANG_BOUND * harness.slow_factor())
    elapsed = time.monotonic() - t
    assert policy.injected > 0, f"no stall injected: {proxy.summary()}"
    assert _retries(mnt) > 0
    # each stall costs about --timeout (2 s); 60 s would mean the timeout is not applied
    assert elapsed < 20 * harness.slow_factor(), f"read took {elapsed:.1f} s with {policy.injected} stalls"


def test_gets_without_etag_hand_out_bytes_as_they_arrive(fault_store, faultproxy, mounter):
    """A server that sends no ETag (a static file server in front of the store, like
    tools/bench's nginx fast path) still hands out a GET's bytes as they arrive
    (design.md, Block cache): a reader gets the first half of a readahead GET that
    then stalls, instead of waiting for that GET to time out."""
    store, content = fault_store
    timeout = 6
    # the readahead's GET after a first 64 KiB read: it sends half its body, then stalls
    policy = Always("stall", limit=1, match=lambda r: r.is_object_get() and r.range.startswith("bytes=65536-"))
    proxy = faultproxy(store.server.port, policy=policy, stall_seconds=60, cut_fraction=0.5,
                       drop_get_headers={"etag"})
    mnt = mounter(store, "--timeout", str(timeout), endpoint=proxy.endpoint)
    want = content["mid.bin"]
    buf = mmap.mmap(-1, 64 * 1024)  # page-aligned, as O_DIRECT wants: reads of exactly 64 KiB
    fd = os.open(mnt.p("mid.bin"), os.O_RDONLY | os.O_DIRECT)
    try:
        assert os.preadv(fd, [buf], 0) == len(buf) and buf[:] == want[:len(buf)]
        t = time.monotonic()
        assert os.preadv(fd, [buf], len(buf)) == len(buf) and buf[:] == want[len(buf):2 * len(buf)]
        elapsed = time.monotonic() - t
    finally:
        os.close(fd)
    assert policy.injected == 1, f"the readahead GET was not stalled: {list(proxy.log)}"
    assert elapsed < timeout / 2, f"the second read waited {elapsed:.1f} s: for the whole GET?"
    # the stalled GET times out and is retried: the file reads exactly
    _read_all_exact(mnt, {"mid.bin": want}, HANG_BOUND * harness.slow_factor())


def test_every_get_503_fails_with_eio_then_recovers(fault_store, faultproxy, mounter):
    store, content = fault_store
    proxy = faultproxy(store.server.port)
    mnt = mounter(store, "--retries", "2", "--timeout", "2", endpoint=proxy.endpoint)
    path = mnt.p("mid.bin")
    assert os.stat(path).st_size == FILES["mid.bin"]  # lookup done while healthy
    proxy.set_policy(Always("503", match=lambda r: r.is_object_get()))
    t = time.monotonic()
    with pytest.raises(OSError) as ei:
        harness.call_with_timeout(lambda: harness.read_file(path), HANG_BOUND * harness.slow_factor(),
                                  "read with every GET answered 503")
    elapsed = time.monotonic() - t
    assert ei.value.errno == errno.EIO, f"got {ei.value!r}, want EIO"
    assert proxy.summary().get("503", 0) >= 3, f"expected 1 try + 2 retries: {proxy.summary()}"
    stats = mnt.stats()
    assert harness.stat_value(stats, "retries") >= 2, stats
    assert harness.stat_value(stats, "errors") >= 1, stats
    print(f"EIO after {elapsed:.1f} s, proxy {proxy.summary()}")
    # the outage ends: the same file reads exactly (no error cached)
    proxy.set_policy(passthrough)
    _read_all_exact(mnt, {"mid.bin": content["mid.bin"]}, HANG_BOUND * harness.slow_factor())


def test_server_killed_mid_read_gives_eio_then_recovers(dedicated_s3server, mounter):
    srv = dedicated_s3server
    store = harness.S3Store(srv)
    size = 96 * MiB
    want = harness.data(size, seed=99)
    store.put("big.bin", want)
    store.put("elsewhere/other.bin", b"other")  # a name not looked up before the kill
    mnt = mounter(store, "--timeout", "2", "--connect-timeout", "1", "--retries", "2",
                  "--cache-size", "32M")
    path = mnt.p("big.bin")
    got = bytearray()
    fd = os.open(path, os.O_RDONLY)
    try:
        got += os.read(fd, 4 * MiB)
        srv.kill()

        def rest():
            while True:
                b = os.read(fd, MiB)
                if not b:
                    return
                got.extend(b)

        t = time.monotonic()
        with pytest.raises(OSError) as ei:
            harness.call_with_timeout(rest, HANG_BOUND * harness.slow_factor(), "read after the server died")
        elapsed = time.monotonic() - t
        assert ei.value.errno == errno.EIO, f"got {ei.value!r} after {len(got)} bytes, want EIO"
        assert bytes(got) == want[:len(got)], "bytes before the error are wrong"
        assert len(got) < size
        print(f"EIO after {elapsed:.1f} s at offset {len(got)}")
        # a name never looked up: the outage must show as EIO, not as a missing file. The
        # root's listing at mount listed elsewhere/ whole on the way (S3 lists every key
        # below the root): wait until it no longer answers (--attr-timeout 1, and the 2 s a
        # directory found is trusted), so that the lookup asks the store
        time.sleep(3)
        e = harness.errno_of(lambda: harness.call_with_timeout(
            lambda: os.stat(mnt.p("elsewhere/other.bin")), HANG_BOUND * harness.slow_factor(), "stat with server down"))
        assert e == errno.EIO, f"stat of an existing key while the server is down: errno {e}, want EIO"
    finally:
        os.close(fd)
    # the server comes back on the same port: everything reads again
    srv.start()
    got = harness.call_with_timeout(lambda: harness.read_file(path), HANG_BOUND * harness.slow_factor(),
                                    "read after restart")
    assert got == want, "file differs after the server came back"
    assert open(mnt.p("elsewhere/other.bin"), "rb").read() == b"other"
