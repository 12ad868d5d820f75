"""Mounts that cannot work must fail fast: non-zero exit, a one-line `ckptfs: ...`
message naming the cause, nothing left mounted. The time bounds are hang checks.
"""

import os
import re
import socket

import pytest

import harness

BOUND = 15  # seconds


def _check_fails(res, cause_re, bound=BOUND):
    bound *= harness.slow_factor()
    assert not res.mounted, f"the mount succeeded but should have failed: {res!r}"
    assert res.rc is not None, f"ckptfs still running after {bound:.0f} s (hang): {res!r}"
    assert res.rc != 0, f"exit status 0 for a failed mount: {res!r}"
    assert res.elapsed < bound, f"took {res.elapsed:.1f} s: {res!r}"
    lines = res.message_lines()
    assert lines, f"no 'ckptfs: ...' line on stderr: {res!r}"
    assert any(re.search(cause_re, ln, re.I) for ln in lines), \
        f"no 'ckptfs:' line matches /{cause_re}/: {lines!r}"
    noise = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(noise) <= 5, f"a one-line message was expected, got {len(noise)} lines: {res.stderr!r}"
    assert not harness.sanitizer_reports(res.stderr), res.stderr
    print(f"({res.elapsed:.2f} s) {lines[0]}")
    return lines


def _s3_args(endpoint):
    return ["-f", "--endpoint-url", endpoint, "--force-path-style", "--connect-timeout", "1",
            "--timeout", "2", "--retries", "1"]


S3ENV = {"AWS_ACCESS_KEY_ID": harness.S3_KEY, "AWS_SECRET_ACCESS_KEY": harness.S3_SECRET,
         "AWS_REGION": harness.S3_REGION}


def test_help_documents_the_options(tmp_path):
    res = harness.run_cli(["--help"], str(tmp_path), mountpoint=False)
    assert res.rc == 0, res
    text = res.stdout + res.stderr
    for opt in ("-f", "-o", "--endpoint-url", "--region", "--profile", "--force-path-style",
                "--cache-dir", "--cache-size", "--disk-cache-size", "--attr-timeout", "--connect-timeout", "--timeout",
                "--retries", "--max-connections", "--log-level"):
        assert re.search(rf"(^|[\s,]){re.escape(opt)}\b", text, re.M), f"--help does not mention {opt}"


def test_unknown_scheme(tmp_path):
    res = harness.run_cli(["-f", "foo://x"], str(tmp_path))
    _check_fails(res, r"foo|scheme")


@pytest.mark.parametrize("url,why", [
    ("s3://", r"expected s3://BUCKET\[/PREFIX\]"),
    ("s3://ab/ckpt", r"3 to 63 characters"),
    ("s3://My_Bucket/ckpt", r"lowercase letters, digits"),
])
def test_invalid_bucket_name_says_which_rule(tmp_path, url, why):
    res = harness.run_cli(["-f", url], str(tmp_path), env=S3ENV)
    _check_fails(res, rf"invalid S3 URL '{re.escape(url)}': .*{why}")


def test_unknown_option(tmp_path):
    d = tmp_path / "store"
    d.mkdir()
    res = harness.run_cli(["-f", "--no-such-option", str(d)], str(tmp_path))
    _check_fails(res, r"no-such-option|unknown|unrecognized|invalid")


def test_missing_local_directory(tmp_path):
    missing = str(tmp_path / "does-not-exist")
    res = harness.run_cli(["-f", missing], str(tmp_path))
    _check_fails(res, re.escape(missing) + r"|no such|not exist|not found")


def test_local_store_is_a_file(tmp_path):
    f = tmp_path / "plainfile"
    f.write_bytes(b"x")
    res = harness.run_cli(["-f", str(f)], str(tmp_path))
    _check_fails(res, r"not a directory|plainfile")


def test_missing_mountpoint(tmp_path):
    d = tmp_path / "store"
    d.mkdir()
    res = harness.run_cli(["-f", str(d), str(tmp_path / "no-mountpoint")], str(tmp_path), mountpoint=False)
    _check_fails(res, r"no-mountpoint|mount ?point|no such|not exist")


def test_missing_bucket(tmp_path, s3server):
    res = harness.run_cli([*_s3_args(s3server.endpoint), "s3://nosuchbucket"], str(tmp_path), env=S3ENV)
    _check_fails(res, r"nosuchbucket")


@pytest.mark.parametrize("which", ["secret", "key_id"])
def test_bad_credentials(tmp_path, s3server, faultproxy, which):
    # s3rver does not check V4 signatures: a proxy checks them as S3 does
    proxy = faultproxy(s3server.port, credentials=(harness.S3_KEY, harness.S3_SECRET))
    env = dict(S3ENV)
    if which == "secret":
        env["AWS_SECRET_ACCESS_KEY"] = "not-the-secret"
    else:
        env["AWS_ACCESS_KEY_ID"] = "NOSUCHKEYID"
    res = harness.run_cli([*_s3_args(proxy.endpoint), f"s3://{s3server.bucket}"], str(tmp_path), env=env)
    _check_fails(res, r"credential|signature|access|denied|forbidden|403")
    assert proxy.rejected, f"the proxy rejected nothing: {list(proxy.log)}"
    assert "not-the-secret" not in res.stderr, "the secret was logged"


def test_good_credentials_mount_through_checking_proxy(tmp_path, s3server, faultproxy):
    # the control for test_bad_credentials: the same set-up with the right secret mounts
    proxy = faultproxy(s3server.port, credentials=(harness.S3_KEY, harness.S3_SECRET))
    store = harness.S3Store(s3server, harness.unique_prefix("goodcreds"))
    store.put("x", b"x")
    with harness.Mount(store.url, str(tmp_path), args=store.mount_args(proxy.endpoint),
                       env=store.mount_env()) as mnt:
        assert os.listdir(mnt.p()) == ["x"]
        assert open(mnt.p("x"), "rb").read() == b"x"
    assert not proxy.rejected, f"correctly signed requests rejected: {list(proxy.log)[-5:]}"
    assert "S3RVER" not in open(mnt.logpath).read().replace(f"# {' '.join(mnt.command())}", ""), \
        "credentials in the log"


def test_no_credentials_private_bucket(tmp_path, s3server, faultproxy):
    # No credentials anywhere (HOME is empty): ckptfs may try anonymous access, which a
    # private bucket refuses (403 AccessDenied from the checking proxy, as from S3).
    proxy = faultproxy(s3server.port, credentials=(harness.S3_KEY, harness.S3_SECRET))
    res = harness.run_cli([*_s3_args(proxy.endpoint), f"s3://{s3server.bucket}"], str(tmp_path),
                          env={"AWS_REGION": harness.S3_REGION})
    _check_fails(res, r"credential|AWS_ACCESS_KEY_ID|access|denied|anonymous|403")


def test_server_unreachable_closed_port(tmp_path):
    port = harness.free_port()  # nothing listens there: connections are refused
    res = harness.run_cli([*_s3_args(f"http://127.0.0.1:{port}"), "s3://bucket"], str(tmp_path), env=S3ENV)
    _check_fails(res, rf"connect|refused|unreachable|endpoint|timed? ?out|{port}")


def test_server_unreachable_silent_listener(tmp_path):
    # A listener that never accepts: TCP connects (backlog) but no byte ever comes back,
    # so only --timeout can end it.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        port = s.getsockname()[1]
        res = harness.run_cli([*_s3_args(f"http://127.0.0.1:{port}"), "s3://bucket"], str(tmp_path),
                              env=S3ENV, timeout=BOUND * harness.slow_factor() + 5)
    _check_fails(res, rf"connect|unreachable|endpoint|timed? ?out|timeout|{port}")


@pytest.mark.parametrize("opt,value", [
    ("--cache-size", "99999999999T"),  # beyond 2^64 bytes: used to wrap to a 0-byte cache
    ("--cache-size", "inf"),
    ("--cache-size", "nan"),
    ("--request-size", "nan"),  # NaN passed the bounds check
    ("--timeout", "3e6"),  # beyond INT_MAX ms: used to become a negative timeout
    ("--timeout", "nan"),
    ("--timeout", "0.0001"),  # rounds to 0 ms
    ("--attr-timeout", "inf"),
])
def test_out_of_range_values_are_refused(tmp_path, opt, value):
    d = tmp_path / "store"
    d.mkdir()
    res = harness.run_cli(["-f", opt, value, str(d)], str(tmp_path))
    _check_fails(res, re.escape(f"bad {opt} '{value}'"))
