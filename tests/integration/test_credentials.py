"""tests/integration/test_credentials.py - credentials the way AWS tools take them, and
never in logs.

  * a profile from ~/.aws-style files (AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE,
    --profile) mounts and reads, with the endpoint and region taken from the config file;
  * with --log-level debug, a working mount that lists, stats and reads never writes the
    secret key or the session token to its log;
  * the provider chain (credserver.py: fake IMDSv2, container endpoint, STS,
    credential_process source; S3 through a proxy that accepts only their unexpired
    tokens): each source wins over the later ones, AssumeRole from a profile, reads and
    uploads across several expiries of seconds-long credentials (also in a daemonized
    mount), a broken source fails the mount with one line, no IMDS means anonymous at once.
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


# --------------------------------------------------------------------------- the chain
# A fake IMDS / container endpoint / STS / credential_process source (credserver.py)
# hands out temporary credentials; S3 requests go through a FaultProxy that accepts only
# tokens it issued, signed with their secret, before they expire.

import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402

from credserver import CredServer  # noqa: E402


@pytest.fixture
def creds(faultproxy, s3server):
    """(credserver, checking proxy in front of s3rver)."""
    srv = CredServer().start()
    proxy = faultproxy(s3server.port, credentials=srv.lookup)
    try:
        yield srv, proxy
    finally:
        srv.stop()


def source_env(srv, tmp_path, which):
    """Environment for every source from `which` on (env, web, profile, container, imds):
    the first one listed must win."""
    order = ["env", "web", "profile", "container", "imds"]
    env = {"AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL_STS": srv.url + "/sts"}
    chosen = order[order.index(which):]
    if "env" in chosen:
        env.update({"AWS_ACCESS_KEY_ID": harness.S3_KEY, "AWS_SECRET_ACCESS_KEY": harness.S3_SECRET})
    if "web" in chosen:
        tok = tmp_path / "web-token"
        tok.write_text(srv.web_token + "\n")
        env.update({"AWS_ROLE_ARN": "arn:aws:iam::1:role/web", "AWS_WEB_IDENTITY_TOKEN_FILE": str(tok),
                    "AWS_ROLE_SESSION_NAME": "it"})
    if "profile" in chosen:
        helper = tmp_path / "cred-helper.py"
        helper.write_text("import sys, urllib.request\n"
                          f"sys.stdout.write(urllib.request.urlopen('{srv.url}/process').read().decode())\n")
        cfg = tmp_path / "aws-config"
        cfg.write_text(f"[default]\ncredential_process = {sys.executable} {helper}\n")
        env["AWS_CONFIG_FILE"] = str(cfg)
    if "container" in chosen:
        env.update({"AWS_CONTAINER_CREDENTIALS_FULL_URI": srv.url + "/container",
                    "AWS_CONTAINER_AUTHORIZATION_TOKEN": "container-auth"})
        srv.container_token = "container-auth"
    if "imds" in chosen:
        env.update({"AWS_EC2_METADATA_DISABLED": "false", "AWS_EC2_METADATA_SERVICE_ENDPOINT": srv.url})
    return env


SOURCE_LOG = {"env": "environment", "web": "web identity", "profile": "credential_process",
              "container": "container credentials endpoint", "imds": "EC2 instance metadata"}
SOURCE_HITS = {"env": None, "web": "sts-web", "profile": "process", "container": "container",
               "imds": "imds"}


@pytest.mark.parametrize("which", ["env", "web", "profile", "container", "imds"])
def test_chain_order(creds, s3server, tmp_path, which):
    """With this source and every later one in the chain configured, this one is used
    (and no later one is even asked), and S3 accepts its credentials."""
    srv, proxy = creds
    store = harness.S3Store(s3server, harness.unique_prefix("chain-" + which))
    store.put("f.bin", b"chain " + which.encode())
    m = harness.Mount(store.url, str(tmp_path), args=store.mount_args(proxy.endpoint),
                      env=source_env(srv, tmp_path, which))
    with m:
        with open(m.p("f.bin"), "rb") as f:
            assert f.read() == b"chain " + which.encode()
    log = m.log()
    assert f"credentials loaded from {SOURCE_LOG[which]}" in log, log
    asked = {k for k, v in srv.hits.items() if v}
    want = {SOURCE_HITS[which]} - {None}
    if which == "imds":
        assert asked == {"imds"}, asked
    else:
        assert asked == want, asked
    assert not proxy.rejected, dict(proxy.rejected)
    if which != "env":
        assert set(proxy.tokens) <= set(srv.generations()) and proxy.tokens, proxy.tokens


def test_assume_role_profile(creds, s3server, tmp_path):
    """role_arn + source_profile: AssumeRole signed (SigV4, service sts) with the source
    profile's keys; the role's temporary credentials then sign S3 requests."""
    srv, proxy = creds
    store = harness.S3Store(s3server, harness.unique_prefix("role"))
    store.put("r.bin", b"role bytes")
    (tmp_path / "credentials").write_text(
        f"[src]\naws_access_key_id = {harness.S3_KEY}\naws_secret_access_key = {harness.S3_SECRET}\n")
    (tmp_path / "config").write_text(
        "[profile job]\nrole_arn = arn:aws:iam::1:role/job\nsource_profile = src\nregion = us-east-1\n"
        f"sts =\n  endpoint_url = {srv.url}/sts\n")
    env = {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"),
           "AWS_CONFIG_FILE": str(tmp_path / "config")}
    m = harness.Mount(store.url, str(tmp_path), args=store.mount_args(proxy.endpoint) + ["--profile", "job"],
                      env=env)
    with m:
        with open(m.p("r.bin"), "rb") as f:
            assert f.read() == b"role bytes"
    assert srv.hits["sts-role"] == 1 and srv.generations("role"), srv.hits
    assert "credentials loaded from profile role (STS AssumeRole)" in m.log()
    assert not proxy.rejected and set(proxy.tokens) == set(srv.generations("role"))


def test_reads_across_several_expiries(creds, s3server, tmp_path):
    """Credentials that live 6 s (refreshed at 3 s): reads over ~20 s stay byte-exact, the
    endpoint handed out several generations, S3 saw requests signed with several of them,
    none was rejected (the proxy rejects expired tokens), and no secret reached the log."""
    srv, proxy = creds
    srv.lifetime = 6
    store = harness.S3Store(s3server, harness.unique_prefix("refresh"))
    files = {f"d/f{i}.bin": harness.data((1 << 20) + i, seed=40 + i) for i in range(12)}
    store.put_many(files.items())
    env = source_env(srv, tmp_path, "imds")
    m = harness.Mount(store.url, str(tmp_path), args=store.mount_args(proxy.endpoint) + ["--log-level", "debug"],
                      env=env)
    with m:
        start = time.monotonic()
        for i, (rel, want) in enumerate(files.items()):
            # a new file each time: every read is a GET with the credentials of the moment
            while time.monotonic() < start + 1.7 * i:
                time.sleep(0.1)
            with open(m.p(rel), "rb") as f:
                assert f.read() == want, rel
    issued = srv.generations("imds")
    assert len(issued) >= 5, f"only {len(issued)} generations handed out"
    used = [t for t in proxy.tokens if t in issued]
    assert len(used) >= 4, f"S3 saw only {len(used)} generations: {proxy.tokens}"
    assert not proxy.rejected, dict(proxy.rejected)
    log = m.log()
    assert "credentials refreshed from EC2 instance metadata" in log
    for _, token, _ in srv.issued:
        assert token not in log and srv.secrets[token][0] not in log


def test_proxy_rejects_expired_tokens(creds):
    """Self-check: the proxy's lookup really rejects an expired or unknown token."""
    srv, _ = creds
    srv.lifetime = 1
    _, _, token, _ = srv._issue("imds")
    assert srv.lookup({"x-amz-security-token": token})[0] == harness.S3_KEY
    time.sleep(1.2)
    assert srv.lookup({"x-amz-security-token": token}) [1][0] == "ExpiredToken"
    assert srv.lookup({"x-amz-security-token": "nope"})[1][0] == "InvalidToken"


BROKEN = [
    ("web", {"sts": "denied"}, "credentials from web identity (STS AssumeRoleWithWebIdentity): "
                               "STS: AccessDenied"),
    ("web-token-file", {}, "cannot read web identity token"),
    ("profile", {"process": "500"}, "credentials from credential_process: credential_process failed"),
    ("container", {"container": "garbage"}, "credentials from container credentials endpoint: "
                                            "container endpoint answer: not a JSON object"),
    ("container-auth", {}, "container endpoint http://127.0.0.1:"),
    ("imds", {"imds": "norole"}, "credentials from EC2 instance metadata (IMDSv2): IMDS "),
]


@pytest.mark.parametrize("which,broken,message", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_source_is_one_line_at_mount(creds, s3server, tmp_path, which, broken, message):
    srv, proxy = creds
    srv.broken.update(broken)
    env = source_env(srv, tmp_path, which.split("-")[0])
    if which == "web-token-file":
        env["AWS_WEB_IDENTITY_TOKEN_FILE"] = str(tmp_path / "missing-token")
    if which == "container-auth":
        env["AWS_CONTAINER_AUTHORIZATION_TOKEN"] = "wrong"
    r = harness.run_cli(["-f", "--endpoint-url", proxy.endpoint, "--force-path-style",
                         f"s3://{s3server.bucket}/x"], str(tmp_path), env=env)
    assert r.rc not in (0, None) and not r.mounted, r
    lines = r.message_lines()
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert r.elapsed < 10, r


def test_no_imds_fails_fast_to_anonymous(s3server, tmp_path):
    """IMDS enabled but nothing listening: the mount goes on unsigned with one warning,
    without waiting for long timeouts (s3rver accepts unsigned requests)."""
    store = harness.S3Store(s3server, harness.unique_prefix("noimds"))
    store.put("a.bin", b"anonymous")
    env = {"AWS_EC2_METADATA_DISABLED": "false",
           "AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://127.0.0.1:1", "AWS_REGION": "us-east-1"}
    t0 = time.monotonic()
    m = harness.Mount(store.url, str(tmp_path), args=store.mount_args(), env=env)
    with m:
        assert time.monotonic() - t0 < 5
        with open(m.p("a.bin"), "rb") as f:
            assert f.read() == b"anonymous"
    assert "IMDS at http://127.0.0.1:1 does not answer): sending unsigned requests" in m.log()


def test_uploads_across_several_expiries(creds, s3server, tmp_path):
    """Writes through the mount (single PUTs and a multipart upload), one every 2 s with
    6 s credentials: every upload lands byte-exact, signed with the credentials of its
    moment, none rejected."""
    srv, proxy = creds
    srv.lifetime = 6
    store = harness.S3Store(s3server, harness.unique_prefix("refresh-up"))
    env = source_env(srv, tmp_path, "imds")
    m = harness.Mount(store.url, str(tmp_path),
                      args=store.mount_args(proxy.endpoint) + ["--part-size", "5M"], env=env)
    files = {f"up/f{i}.bin": harness.data((12 << 20) if i == 3 else (1 << 20) + i, seed=70 + i)
             for i in range(6)}
    with m:
        os.makedirs(m.p("up"), exist_ok=True)
        start = time.monotonic()
        for i, (rel, content) in enumerate(files.items()):
            while time.monotonic() < start + 2 * i:
                time.sleep(0.1)
            with open(m.p(rel), "wb") as f:
                f.write(content)
            m.sync("up")
    for rel, content in files.items():
        assert store.get(rel) == content, rel
    assert not proxy.rejected, dict(proxy.rejected)
    used = [t for t in proxy.tokens if t in srv.generations("imds")]
    assert len(used) >= 3, f"uploads signed with only {len(used)} generations"


def daemon_pids(mountpoint):
    """PIDs of ckptfs processes whose command line ends with this mountpoint."""
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if argv[0].endswith(b"/ckptfs") and mountpoint.encode() in argv:
                pids.append(int(d))
    return pids


def test_refresh_in_a_daemonized_mount(creds, s3server, tmp_path):
    """Without -f the daemon forks after the store is opened (fuse_daemonize): refreshes
    must still happen in the forked daemon (a thread started before the fork would be
    gone). Reads over ~12 s with 4 s credentials stay byte-exact."""
    srv, proxy = creds
    srv.lifetime = 4
    store = harness.S3Store(s3server, harness.unique_prefix("daemon"))
    files = {f"g{i}.bin": harness.data((256 << 10) + i, seed=90 + i) for i in range(7)}
    store.put_many(files.items())
    mp, logf = tmp_path / "mnt", tmp_path / "daemon.log"
    mp.mkdir()
    env = harness.clean_env(source_env(srv, tmp_path, "imds"), home=str(tmp_path / "home"))
    cmd = [harness.ckptfs_bin(), "--log-file", str(logf), "--cache-dir", str(tmp_path / "cache"),
           *store.mount_args(proxy.endpoint), store.url, str(mp)]
    r = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    daemons = daemon_pids(str(mp))
    try:
        assert harness.mount_entry(str(mp)), "not mounted"
        start = time.monotonic()
        for i, (rel, want) in enumerate(files.items()):
            while time.monotonic() < start + 2 * i:
                time.sleep(0.1)
            got = harness.call_with_timeout(lambda: open(mp / rel, "rb").read(), 30, rel)
            assert got == want, rel
    finally:
        subprocess.run(["fusermount3", "-u", str(mp)], capture_output=True, timeout=30)
        deadline = time.monotonic() + 15
        while (harness.mount_entry(str(mp)) or daemon_pids(str(mp))) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = daemon_pids(str(mp))
        for pid in left:  # ours (its command line names our mountpoint): end it by PID
            os.kill(pid, 9)
    assert len(daemons) == 1 and not left, (daemons, left)
    assert not proxy.rejected, dict(proxy.rejected)
    assert len(srv.generations("imds")) >= 3, srv.issued  # refreshed in the forked daemon


def test_container_token_file_wins(creds, s3server, tmp_path):
    """AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE is used (re-read at each fetch) over
    AWS_CONTAINER_AUTHORIZATION_TOKEN; with 3 s credentials the refreshes read it too."""
    srv, proxy = creds
    srv.lifetime = 3
    store = harness.S3Store(s3server, harness.unique_prefix("ctoken"))
    store.put_many([(f"c{i}.bin", harness.data(4096 + i, seed=i)) for i in range(3)])
    tok = tmp_path / "eks-pod-identity-token"
    tok.write_text("container-auth\n")
    env = source_env(srv, tmp_path, "container")
    env.update({"AWS_CONTAINER_AUTHORIZATION_TOKEN": "stale", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": str(tok)})
    m = harness.Mount(store.url, str(tmp_path), args=store.mount_args(proxy.endpoint), env=env)
    with m:
        for i in range(3):
            time.sleep(2 if i else 0)
            with open(m.p(f"c{i}.bin"), "rb") as f:
                assert f.read() == harness.data(4096 + i, seed=i)
    assert len(srv.generations("container")) >= 2, srv.issued
    assert not proxy.rejected, dict(proxy.rejected)
