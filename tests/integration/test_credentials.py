"""tests/integration/test_credentials.py - credentials the way AWS tools take them, and
never in logs.

  * a profile from ~/.aws-style files (AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE,
    --profile) mounts and reads, with the endpoint and region taken from the config file;
  * with --log-level debug, a working mount that lists, stats and reads never writes the
    secret key or the session token to its log.
"""
import os

import harness

SECRET = "sEcReT-sentinel-7f3a9c"
TOKEN = "SeSsIoNtOkEn-sentinel-42b1"


def test_profile_from_aws_files(s3server, tmp_path):
    store = harness.S3Store(s3server, harness.unique_prefix("profile"))
    store.put("d/f.bin", b"profile bytes")
    aws = tmp_path / "aws"
    aws.mkdir()
    (aws / "credentials").write_text(
        f"[default]\naws_access_key_id = WRONG\naws_secret_access_key = WRONG\n\n"
        f"[ckpt]\naws_access_key_id = {harness.S3_KEY}\n"
        f"aws_secret_access_key = {harness.S3_SECRET}\n")
    (aws / "config").write_text(
        f"[profile ckpt]\nregion = us-east-1\nendpoint_url = {s3server.endpoint}\n")
    env = {"AWS_SHARED_CREDENTIALS_FILE": str(aws / "credentials"),
           "AWS_CONFIG_FILE": str(aws / "config")}
    m = harness.Mount(store.url, str(tmp_path), args=["--profile", "ckpt", "--force-path-style"],
                      env=env)
    with m:
        with open(m.p("d/f.bin"), "rb") as f:
            assert f.read() == b"profile bytes"


def test_secrets_never_logged(s3server, tmp_path):
    store = harness.S3Store(s3server, harness.unique_prefix("secrets"))
    store.put("a/b.bin", harness.data(3 << 20, seed=5))
    # s3rver checks the key id but not the signature: a sentinel secret still works
    env = {"AWS_ACCESS_KEY_ID": harness.S3_KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
           "AWS_SESSION_TOKEN": TOKEN, "AWS_REGION": "us-east-1"}
    m = harness.Mount(store.url, str(tmp_path),
                      args=store.mount_args() + ["--log-level", "debug"], env=env)
    with m:
        assert os.listdir(m.p("a")) == ["b.bin"]
        with open(m.p("a/b.bin"), "rb") as f:
            assert len(f.read()) == 3 << 20
        assert not os.path.exists(m.p("a/missing"))
    log = m.log()
    assert " debug: s3: GET " in log  # the check means something only if requests were logged
    assert SECRET not in log and TOKEN not in log
    assert "Authorization" not in log and "Signature=" not in log
