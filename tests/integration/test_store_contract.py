"""The store contract (tests/unit/test_store_contract.c) against the S3 servers.

ctest runs the contract suite on the in-memory store and a local directory; here the same
binary runs against s3rver (the session fixture) and, when Ceph is installed, radosgw
(the `rgw` fixture: skipped without Ceph unless CKPTFS_REQUIRE_RGW=1). The binary is
found next to CKPTFS_BIN: <build>/tests/unit/test_store_contract.

A contract test the server cannot run says so (criterion's [SKIP] line with the reason,
e.g. s3rver's missing ListMultipartUploads); every skip is printed, and the skips a
server may make are listed here, so a new one fails the run instead of hiding.
"""

import os
import re
import subprocess

import pytest

import harness

TIMEOUT = 600  # seconds, times slow_factor under ASan: ~30 s on s3rver unsanitized


def contract_bin():
    b = os.path.join(os.path.dirname(os.path.dirname(harness.ckptfs_bin())), "tests", "unit",
                     "test_store_contract")
    if not os.access(b, os.X_OK):
        pytest.fail(f"contract suite not built at {b} (build the tree CKPTFS_BIN is in)", pytrace=False)
    return b


def run_contract(url, endpoint, key, secret, declared, optional):
    """Run the suite on url; declared: {check: why} this server is known to fail (the
    suite skips those checks, saying why); optional: tests that may skip because the
    store leaves an optional function NULL or the server answers -ENOSYS. Any other
    skip, or any failure, fails."""
    env = harness.clean_env({
        "CKPTFS_CONTRACT_STORE": url,
        "CKPTFS_CONTRACT_ENDPOINT": endpoint,
        "CKPTFS_CONTRACT_SKIP": ";".join(f"{k}={v}" for k, v in declared.items()),
        "AWS_ACCESS_KEY_ID": key,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_REGION": harness.S3_REGION,
    })
    p = subprocess.run([contract_bin(), "--verbose", "--jobs", "2"], env=env, capture_output=True,
                       text=True, timeout=TIMEOUT * harness.slow_factor())
    out = p.stdout + p.stderr
    print(out)
    assert p.returncode == 0, f"contract suite failed on {url}:\n{out[-6000:]}"
    assert not harness.sanitizer_reports(out), out[-6000:]
    m = re.search(r"Synthesis: Tested: (\d+) \| Passing: (\d+) \| Failing: (\d+) \| Crashing: (\d+)", out)
    assert m, f"no criterion synthesis in:\n{out[-3000:]}"
    assert int(m.group(1)) > 0 and m.group(3) == "0" and m.group(4) == "0", m.group(0)
    skips = dict(re.findall(r"\[SKIP\] contract::(\w+): (.*)", out))
    for test, why in skips.items():
        declared_here = any(why.startswith(f"{check} on this") for check in declared)
        assert declared_here or test in optional, f"{test} skipped on {url}, not expected: {why}"
    return skips


# S3 has no rename and no file descriptors; AWS (and these servers) answer 204 to a
# DeleteObject of a missing key, so the store cannot report -ENOENT there.
S3_OPTIONAL = {"rename", "open_fd", "remove_missing"}

# s3rver 3.7.1's gaps, each a check the suite skips there (it says which and why).
S3RVER_DECLARED = {
    "read_first_byte": "s3rver answers Range bytes=0-0 with the whole object (the store: -EIO)",
    "copy_stale_etag": "s3rver ignores x-amz-copy-source-if-match (copies any version)",
    "multipart_abort": "s3rver answers AbortMultipartUpload with 405 MethodNotAllowed",
    "multipart_bad_parts": "s3rver does not check the part ETags of a completion",
    "multipart_complete_retried": "s3rver answers a completion sent again with 500 InternalError, "
                                  "not NoSuchUpload",
}
# radosgw (Ceph 16) gaps.
RGW_DECLARED = {
    "copy_stale_etag": "radosgw 16 ignores x-amz-copy-source-if-match (it reads x-amz-copy-if-match)",
}


# The contract suite passes against s3rver (skipping only what s3rver cannot do)
def test_contract_s3rver(s3server):
    url = f"s3://{s3server.bucket}/{harness.unique_prefix('contract')}"
    skips = run_contract(url, s3server.endpoint, harness.S3_KEY, harness.S3_SECRET,
                         S3RVER_DECLARED, S3_OPTIONAL | {"multipart_list"})
    print("skipped on s3rver:", skips)


# The contract suite passes against radosgw (a real S3: only its declared gaps are skipped)
def test_contract_rgw(rgw):
    url = f"s3://{rgw.bucket}/{harness.unique_prefix('contract')}"
    skips = run_contract(url, rgw.endpoint, rgw.key, rgw.secret, RGW_DECLARED, S3_OPTIONAL)
    print("skipped on radosgw:", skips)
