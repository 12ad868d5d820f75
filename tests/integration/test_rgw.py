"""Smoke tests against a real S3 implementation: Ceph radosgw (ceph.py, fixtures `rgw`
and `rgw_store`; skipped when Ceph is not installed).

What it owns: proof that the rgw harness is what we want it to be (a user with fixed
keys, a bucket, AWS-style "md5-N" multipart ETags, SigV4 actually checked) and that
ckptfs reads work against it: byte-exact whole and ranged reads of a small object and a
boto3 multipart object, listings (a paginated one, names that need encoding), and a
mount with a wrong secret refused with a signature message.
"""

import hashlib
import io
import os
import stat
import time

import pytest

import harness
from harness import MiB

BOUND = 60  # seconds (times slow_factor under ASan) before a read counts as hung


def timed(fn, what):
    return harness.call_with_timeout(fn, BOUND * harness.slow_factor(), what)


def multipart_etag(blob, part):
    """The ETag S3 gives an object uploaded in parts of `part` bytes: md5 of the parts'
    binary md5s, "-" the number of parts."""
    digests = [hashlib.md5(blob[i:i + part]).digest() for i in range(0, len(blob), part)]
    return f'"{hashlib.md5(b"".join(digests)).hexdigest()}-{len(digests)}"'


def upload_multipart(store, rel, blob, part=8 * MiB):
    """Upload with boto3's managed transfer in `part`-byte parts; returns the ETag."""
    from boto3.s3.transfer import TransferConfig

    cfg = TransferConfig(multipart_threshold=part, multipart_chunksize=part, max_concurrency=4)
    store.s3.upload_fileobj(io.BytesIO(blob), store.bucket, store.key(rel), Config=cfg)
    return store.s3.head_object(Bucket=store.bucket, Key=store.key(rel))["ETag"]


def client_error(fn):
    """(HTTP status, S3 error code) of the botocore ClientError fn raises."""
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError) as ei:
        fn()
    err = ei.value.response
    return err["ResponseMetadata"]["HTTPStatusCode"], err["Error"]["Code"]


def test_rgw_harness(rgw, rgw_store):
    print(f"rgw at {rgw.endpoint}: started in {rgw.startup_seconds:.1f} s, daemons {rgw.alive()}")
    assert set(rgw.alive()) == {"mon", "osd", "rgw"}
    s3 = rgw.client()
    assert rgw.bucket in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    small = b"hello rgw\n"
    rgw_store.put("small.txt", small)
    head = s3.head_object(Bucket=rgw.bucket, Key=rgw_store.key("small.txt"))
    assert head["ETag"] == f'"{hashlib.md5(small).hexdigest()}"'
    # multipart: AWS-style ETag, not s3rver's plain MD5 of the whole object
    blob = harness.data(20 * MiB + 5, seed=7)
    etag = upload_multipart(rgw_store, "mp.bin", blob, part=8 * MiB)
    assert etag == multipart_etag(blob, 8 * MiB) and etag.endswith('-3"'), etag
    body = s3.get_object(Bucket=rgw.bucket, Key=rgw_store.key("mp.bin"), Range="bytes=8388607-8388616")
    assert body["ContentRange"] == f"bytes 8388607-8388616/{len(blob)}"
    assert body["Body"].read() == blob[8388607:8388617]
    rgw_store.delete("mp.bin")
    assert client_error(lambda: s3.head_object(Bucket=rgw.bucket, Key=rgw_store.key("mp.bin")))[0] == 404


def test_rgw_checks_sigv4(rgw, rgw_store):
    from botocore import UNSIGNED

    rgw_store.put("secret.txt", b"s")
    key = rgw_store.key("secret.txt")
    assert rgw.client().get_object(Bucket=rgw.bucket, Key=key)["Body"].read() == b"s"
    wrong_secret = harness.s3_client(rgw.endpoint, key_id=rgw.key, secret=rgw.secret[:-1] + "X")
    assert client_error(lambda: wrong_secret.get_object(Bucket=rgw.bucket, Key=key)) == \
        (403, "SignatureDoesNotMatch")
    unknown_key = harness.s3_client(rgw.endpoint, key_id="NOSUCHKEYID0000000000", secret=rgw.secret)
    assert client_error(lambda: unknown_key.get_object(Bucket=rgw.bucket, Key=key)) == \
        (403, "InvalidAccessKeyId")
    anonymous = harness.s3_client(rgw.endpoint, signature_version=UNSIGNED)
    assert client_error(lambda: anonymous.get_object(Bucket=rgw.bucket, Key=key)) == (403, "AccessDenied")
    # a signed header changed after signing (what a proxy or a signer bug would do)
    tampered = rgw.client()

    def change_range(request, **kw):
        request.headers["Range"] = "bytes=0-0"

    tampered.meta.events.register("before-send.s3.GetObject", change_range)
    assert client_error(lambda: tampered.get_object(Bucket=rgw.bucket, Key=key, Range="bytes=0-1")) == \
        (403, "SignatureDoesNotMatch")


def test_mount_reads_small_and_multipart_objects(rgw_store, mounter):
    small = b"small object on rgw\n" * 3
    big = harness.data(64 * MiB, seed=64)
    rgw_store.put("ckpt/small.txt", small)
    etag = upload_multipart(rgw_store, "ckpt/big.bin", big)  # boto3 default: 8 MiB parts
    assert etag == multipart_etag(big, 8 * MiB) and etag.endswith('-8"'), etag
    mnt = mounter(rgw_store)
    assert os.listdir(mnt.p()) == ["ckpt"]
    assert sorted(os.listdir(mnt.p("ckpt"))) == ["big.bin", "small.txt"]
    for name, want in (("small.txt", small), ("big.bin", big)):
        st = os.stat(mnt.p(f"ckpt/{name}"))
        assert stat.S_ISREG(st.st_mode) and st.st_size == len(want), (name, st)
    assert timed(lambda: open(mnt.p("ckpt/small.txt"), "rb").read(), "read small") == small
    t = time.monotonic()
    digest, n = timed(lambda: harness.sha256_file(mnt.p("ckpt/big.bin")), "read 64 MiB")
    elapsed = time.monotonic() - t
    assert n == len(big) and digest == harness.sha256(big), "64 MiB multipart object: bytes differ"
    print(f"rgw: 64 MiB cold read {len(big) / elapsed / 1e6:.0f} MB/s; stats {mnt.stats()}")
    # ranged reads across part (8 MiB) and stripe (4 MiB) boundaries of the rgw object
    fd = os.open(mnt.p("ckpt/big.bin"), os.O_RDONLY)
    try:
        for off, size in ((8 * MiB - 1, 2), (4 * MiB - 100, 200), (56 * MiB - 7, MiB + 14),
                          (64 * MiB - 10, 100), (64 * MiB, 10), (12345, 1)):
            got = timed(lambda: os.pread(fd, size, off), f"pread {size}@{off}")
            assert got == big[off:off + size], f"pread {size}@{off}: bytes differ"
    finally:
        os.close(fd)
    assert harness.stat_value(mnt.stats(), "errors") == 0


SPECIAL_NAMES = ["sp ace", "plus+sign", "eq=ual&amp", "per%25cent", "uni-\u00fc\u00df-\u6587", "tilde~x",
                 "semi;colon,comma", "paren(1)'q", "star*!", "dollar$@:", "x" * 200]


def test_mount_lists_directories(rgw_store, mounter):
    """A directory longer than one ListObjectsV2 page (1000; rgw's continuation token is
    the last key itself, special characters and all), sub-prefixes, odd names."""
    files = {f"k{i:04d}": b"%d" % i for i in range(1100)}
    odd = {n: (n * 2).encode() for n in SPECIAL_NAMES}
    items = [(f"many/{k}", v) for k, v in files.items()]
    items += [(f"many/k0999 {n}", v) for n, v in odd.items()]  # at the page boundary
    items += [("many/k0999d/inner", b"in"), ("many/sub/deeper/f", b"f")]
    t = time.monotonic()
    rgw_store.put_many(items, workers=8)
    print(f"rgw: uploaded {len(items)} objects in {time.monotonic() - t:.1f} s")
    mnt = mounter(rgw_store)
    names = timed(lambda: os.listdir(mnt.p("many")), "listdir")
    want = set(files) | {f"k0999 {n}" for n in odd} | {"k0999d", "sub"}
    assert len(names) == len(set(names)), "duplicate entries"
    assert set(names) == want, f"missing {sorted(want - set(names))[:10]}, extra {sorted(set(names) - want)[:10]}"
    with os.scandir(mnt.p("many")) as it:
        assert {e.name for e in it if e.is_dir()} == {"k0999d", "sub"}
    assert os.listdir(mnt.p("many/sub")) == ["deeper"]
    for n, v in odd.items():
        assert os.stat(mnt.p(f"many/k0999 {n}")).st_size == len(v), n
        assert open(mnt.p(f"many/k0999 {n}"), "rb").read() == v, n
    assert open(mnt.p("many/k1099"), "rb").read() == b"1099"
    assert open(mnt.p("many/k0999d/inner"), "rb").read() == b"in"


def test_mount_with_wrong_secret_is_refused(rgw_store, tmp_path):
    rgw_store.put("x", b"x")
    env = dict(rgw_store.mount_env(), AWS_SECRET_ACCESS_KEY="not-the-secret")
    res = harness.run_cli(["-f", *rgw_store.mount_args(), rgw_store.url], str(tmp_path), env=env)
    assert not res.mounted and res.rc not in (None, 0), res
    assert "SignatureDoesNotMatch" in res.stderr or "signature" in res.stderr.lower(), res
    assert "not-the-secret" not in res.stderr, "the secret was logged"
