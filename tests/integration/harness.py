"""tests/integration/harness.py - processes and stores the integration tests drive.

What it owns:
  * S3Server     - one s3rver child on a free loopback port with a fresh data dir;
                   started, killed (crash), restarted and stopped by PID only.
  * S3Store /
    DirStore     - one test's store: an s3rver bucket prefix or a local directory,
                   filled through the same put()/delete() so a suite runs on both.
  * Mount        - one `ckptfs -f ... STORE MOUNTPOINT` child: waits for the mount in
                   /proc/self/mountinfo, always unmounts (fusermount3 -u, then -uz),
                   reaps the child (killing it by PID only if it will not exit),
                   checks its exit code and scans its stderr for sanitizer reports.
  * run_cli      - a ckptfs run that is expected to fail (mount errors), bounded.
  * helpers      - free ports, deterministic data, timed calls for hang checks.

Stdlib + boto3 only. Every process started here is ended by its PID; every mount is
unmounted, also when a test fails. Network: 127.0.0.1 only.
"""

import contextlib
import errno
import hashlib
import http.client
import json
import os
import random
import re
import shutil
import socket
import subprocess
import threading
import time
import uuid

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
S3RVER_BIN = os.path.join(REPO_ROOT, "tests", "s3rver", "node_modules", ".bin", "s3rver")
S3_KEY = "S3RVER"
S3_SECRET = "S3RVER"
S3_REGION = "us-east-1"
MiB = 1 << 20

SANITIZER_MARKERS = (
    "ERROR: AddressSanitizer",
    "ERROR: LeakSanitizer",
    "runtime error:",
    "SUMMARY: UndefinedBehaviorSanitizer",
    "WARNING: ThreadSanitizer",
)


# (title, line) pairs a test module adds (e.g. timings); conftest prints them, grouped by
# title, at the end of the run
SUMMARY = []


class HarnessError(AssertionError):
    """A failure of the thing under test seen by the harness (fails the test)."""


# --------------------------------------------------------------------------- binary


def ckptfs_bin():
    """Path of the ckptfs binary under test: $CKPTFS_BIN or build/fs/ckptfs."""
    path = os.environ.get("CKPTFS_BIN") or os.path.join(REPO_ROOT, "build", "fs", "ckptfs")
    if not os.path.isabs(path):
        path = os.path.join(REPO_ROOT, path)
    return path


def admin_bin():
    """Path of the ckptfs-admin binary under test: $CKPTFS_ADMIN or build/tools/admin/."""
    path = os.environ.get("CKPTFS_ADMIN") or os.path.join(REPO_ROOT, "build", "tools", "admin",
                                                          "ckptfs-admin")
    if not os.path.isabs(path):
        path = os.path.join(REPO_ROOT, path)
    return path


def wait_index(m, key, want, timeout=20):
    """Wait until the mount's stats index.KEY reaches want; its index stats."""
    deadline = time.monotonic() + timeout * slow_factor()
    while time.monotonic() < deadline:
        ix = m.stats()["index"]
        if ix[key] >= want:
            return ix
        time.sleep(0.05)
    raise AssertionError(f"index.{key} did not reach {want}: {m.stats()['index']}")


_asan_cache = {}


def is_sanitized(path):
    """True if the binary was built with ASan/UBSan (looks for the runtime's symbols)."""
    if path not in _asan_cache:
        try:
            with open(path, "rb") as f:
                blob = f.read()
            _asan_cache[path] = b"__asan_init" in blob or b"__ubsan_handle" in blob
        except OSError:
            _asan_cache[path] = False
    return _asan_cache[path]


def slow_factor():
    """Multiplier for time bounds that depend on the daemon's speed (ASan is slower)."""
    return 3.0 if is_sanitized(ckptfs_bin()) else 1.0


def sanitizer_env(env):
    """Sanitizer options for a daemon: keep going to the report, write it to stderr."""
    env = dict(env)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0:halt_on_error=1")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
    return env


def _leak_blocks(report):
    """The allocation stacks of a LeakSanitizer report: one list of frame lines each."""
    blocks = []
    for ln in report.splitlines():
        if re.match(r"(Direct|Indirect) leak of ", ln):
            blocks.append([])
        elif blocks and re.match(r"\s+#\d+ ", ln):
            blocks[-1].append(ln)
    return blocks


def libfuse_handle_leak(report):
    """True if every allocation a LeakSanitizer report lists was made by libfuse itself
    (the first frame past the sanitizer's interceptor is in libfuse3.so). libfuse's
    high-level API allocates a directory handle at opendir and frees it at releasedir;
    the kernel sends RELEASEDIR in the background after close(), and a test that closes
    a directory and unmounts at once can end the session before it arrives (seen once
    in many runs: 120 + 131072 bytes of an open directory). Our own allocations have
    their first frame in ckptfs, so they still fail the test."""
    blocks = _leak_blocks(report)
    if not blocks:
        return False
    for frames in blocks:
        past = [f for f in frames if "asan" not in f and "__interceptor_" not in f]
        if not past or "libfuse3.so" not in past[0]:
            return False
    return True


def sanitizer_reports(text):
    """The lines of a daemon's stderr that are sanitizer reports (leaks that are libfuse's
    own unreleased handles excepted: see libfuse_handle_leak)."""
    lines = [ln for ln in text.splitlines() if any(m in ln for m in SANITIZER_MARKERS)]
    if lines and all("LeakSanitizer" in ln for ln in lines):
        start = text.find("ERROR: LeakSanitizer")
        end = text.find("SUMMARY: AddressSanitizer", start)
        if text.count("ERROR: LeakSanitizer") == 1 and libfuse_handle_leak(text[start:end]):
            return []
    return lines


# --------------------------------------------------------------------------- utilities


def free_port():
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def data(size, seed):
    """size deterministic pseudo-random bytes (fast: ~300 MB/s)."""
    return random.Random(seed).randbytes(size)


def sha256(b):
    return hashlib.sha256(b).hexdigest()


def tail(path, n=60):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            lines = f.read().decode("utf-8", "replace").splitlines()
        return "\n".join(lines[-n:])
    except OSError as e:
        return f"<no log: {e}>"


def call_with_timeout(fn, timeout, what="operation"):
    """Run fn() in a daemon thread; return its result or raise what it raised.

    If it does not finish within timeout seconds raise HarnessError (a hang). The thread
    stays blocked until the mount under it is torn down, which the Mount teardown does.
    """
    box = {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: B902 - handed back to the caller
            box["error"] = e

    t = threading.Thread(target=run, daemon=True, name=f"timed:{what}")
    start = time.monotonic()
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise HarnessError(f"{what} did not finish within {timeout:.0f} s (hang)")
    box["elapsed"] = time.monotonic() - start
    if "error" in box:
        raise box["error"]
    return box["result"]


def read_file(path, chunk=MiB):
    """Read a whole file with chunk-sized reads; returns bytes."""
    out = bytearray()
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(chunk)
            if not b:
                return bytes(out)
            out += b


def sha256_file(path, chunk=MiB):
    h = hashlib.sha256()
    n = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(chunk)
            if not b:
                return h.hexdigest(), n
            h.update(b)
            n += len(b)


def _unescape_mountinfo(s):
    # mountinfo escapes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 4 <= len(s) and s[i + 1 : i + 4].isdigit():
            out.append(chr(int(s[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


@contextlib.contextmanager
def tmpfs(path, size):
    """A tmpfs of size (mount(8)'s size=, e.g. "2m") mounted on the new folder path for the
    with block; unmounted after it, even on failure (retried while a daemon that used it
    is still exiting; lazily, and an AssertionError, if it stays busy)."""
    os.mkdir(path)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], check=True)
    try:
        yield path
    finally:
        for _ in range(40):
            if subprocess.run(["umount", path], capture_output=True).returncode == 0:
                break
            time.sleep(0.25)
        else:
            subprocess.run(["umount", "-l", path], check=True)
            raise AssertionError(f"{path} still busy after the test: unmounted lazily")


def fill_disk(folder):
    """Fill folder's file system to the last byte with one file, folder/junk; its path."""
    junk = os.path.join(folder, "junk")
    fd = os.open(junk, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"x" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    return junk


def mount_entry(mountpoint):
    """(fstype, source, major:minor) of the topmost mount at mountpoint, or None."""
    # resolve only the parent: stat()ing the mountpoint itself would ask the daemon
    mp = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(mountpoint))),
                      os.path.basename(os.path.abspath(mountpoint)))
    found = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            if len(fields) < 5 or _unescape_mountinfo(fields[4]) != mp:
                continue
            rf = right.split()
            found = (rf[0], rf[1] if len(rf) > 1 else "", fields[2])
    return found


# --------------------------------------------------------------------------- s3rver


class S3Server:
    """An s3rver child on 127.0.0.1 with one bucket; stopped by PID."""

    def __init__(self, datadir, bucket="ckptfs-it", port=None, logpath=None):
        self.datadir = datadir
        self.bucket = bucket
        self.port = port or free_port()
        self.logpath = logpath or os.path.join(os.path.dirname(datadir.rstrip("/")), f"s3rver-{self.port}.log")
        self.proc = None
        os.makedirs(datadir, exist_ok=True)

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout=20):
        if not os.access(S3RVER_BIN, os.X_OK):
            raise RuntimeError(f"s3rver not installed at {S3RVER_BIN}: run tools/setup")
        cmd = [S3RVER_BIN, "-d", self.datadir, "-p", str(self.port), "--address", "127.0.0.1",
               "--silent", "--configure-bucket", self.bucket]
        # s3rver makes ListObjectsV2 continuation tokens with DES, which Node >= 17
        # (OpenSSL 3) only has in the legacy provider: without it every truncated V2
        # listing is a 500 InternalError.
        env = dict(os.environ)
        env["NODE_OPTIONS"] = (env.get("NODE_OPTIONS", "") + " --openssl-legacy-provider").strip()
        log = open(self.logpath, "ab")
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         env=env, start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"s3rver exited with {self.proc.returncode}:\n{tail(self.logpath)}")
            if self._answers():
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"s3rver did not answer on port {self.port} within {timeout} s")

    def _answers(self):
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
            c.request("HEAD", f"/{self.bucket}")
            r = c.getresponse()
            r.read()
            c.close()
            return r.status == 200  # the bucket exists: start-up is complete
        except OSError:
            return False

    def kill(self):
        """Crash it (SIGKILL): clients see resets and refused connections."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self):
        """Stop it by PID: SIGTERM, then SIGKILL after 5 s."""
        if not self.proc or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self):
        """Start again on the same port and data dir (after kill/stop)."""
        self.stop()
        return self.start()

    def client(self, **cfg):
        return s3_client(self.endpoint, **cfg)


def s3_client(endpoint, key_id=S3_KEY, secret=S3_SECRET, **cfg):
    """A boto3 S3 client for s3rver at endpoint (path-style, S3RVER creds)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3", endpoint_url=endpoint, region_name=S3_REGION,
        aws_access_key_id=key_id, aws_secret_access_key=secret,
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=16,
                      retries={"max_attempts": 3, "mode": "standard"}, **cfg))


# --------------------------------------------------------------------------- stores


class DirStore:
    """A local-directory store: STORE is the directory path."""

    kind = "dir"
    shows_partial_objects = False  # ckptfs renames whole files into place

    def __init__(self, root):
        self.root = root
        os.makedirs(root, exist_ok=True)
        self.url = root

    def put(self, relpath, content):
        """Store content (bytes, or a path of a file to copy) at relpath."""
        dst = os.path.join(self.root, relpath)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if isinstance(content, (bytes, bytearray, memoryview)):
            with open(dst, "wb") as f:
                f.write(content)
        else:
            shutil.copyfile(content, dst)

    def put_many(self, items, workers=8):
        for rel, content in items:
            self.put(rel, content)

    def delete(self, relpath):
        os.unlink(os.path.join(self.root, relpath))

    def get(self, relpath):
        """The stored bytes at relpath, or None if there is no such file."""
        try:
            with open(os.path.join(self.root, relpath), "rb") as f:
                return f.read()
        except (FileNotFoundError, IsADirectoryError):
            return None

    def size(self, relpath):
        """The stored size at relpath, or None."""
        try:
            return os.stat(os.path.join(self.root, relpath)).st_size
        except FileNotFoundError:
            return None

    def keys(self, prefix=""):
        """Every stored file below prefix (relative paths, sorted), temporaries included."""
        out = []
        base = os.path.join(self.root, prefix) if prefix else self.root
        for d, _, files in os.walk(base):
            for f in files:
                out.append(os.path.relpath(os.path.join(d, f), self.root))
        return sorted(out)

    def uploads(self):
        """Uploads in progress: the directory store's temporary files."""
        return [k for k in self.keys() if os.path.basename(k).startswith(".ckptfs-upload.")]

    def mount_args(self):
        return []

    def mount_env(self):
        return {}


class S3Store:
    """A prefix of an s3rver bucket: STORE is s3://BUCKET[/PREFIX]."""

    kind = "s3"
    # s3rver streams a PUT (and a multipart completion) straight into the object's file:
    # while the request runs, listings and HEAD already show the growing object. A real
    # S3 (and radosgw) shows an object only when it is whole, so "no partial object" is
    # checked on those, not here.
    shows_partial_objects = True

    def __init__(self, server, prefix=None):
        self.server = server
        self.bucket = server.bucket
        self.prefix = prefix.strip("/") if prefix else ""
        self.url = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self.s3 = server.client()

    def key(self, relpath):
        return f"{self.prefix}/{relpath}" if self.prefix else relpath

    def put(self, relpath, content):
        """Store content (bytes, or a path of a file) at relpath with one PutObject
        (no multipart: s3rver's multipart completion is slow)."""
        if isinstance(content, (bytes, bytearray, memoryview)):
            self.s3.put_object(Bucket=self.bucket, Key=self.key(relpath), Body=bytes(content))
        else:
            with open(content, "rb") as f:
                self.s3.put_object(Bucket=self.bucket, Key=self.key(relpath), Body=f)

    def put_many(self, items, workers=8):
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers) as ex:
            for fut in [ex.submit(self.put, rel, c) for rel, c in items]:
                fut.result()

    def delete(self, relpath):
        self.s3.delete_object(Bucket=self.bucket, Key=self.key(relpath))

    def get(self, relpath):
        """The stored bytes at relpath, or None if there is no such key."""
        try:
            return self.s3.get_object(Bucket=self.bucket, Key=self.key(relpath))["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return None

    def size(self, relpath):
        """The stored size at relpath, or None."""
        try:
            return self.s3.head_object(Bucket=self.bucket, Key=self.key(relpath))["ContentLength"]
        except Exception as e:  # botocore ClientError 404
            if "404" in str(e) or "Not Found" in str(e):
                return None
            raise

    def keys(self, prefix=""):
        """Every key below prefix (relative to the store's prefix, sorted)."""
        out = []
        full = self.key(prefix) if prefix else (self.prefix + "/" if self.prefix else "")
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full):
            for o in page.get("Contents", []):
                k = o["Key"]
                out.append(k[len(self.prefix) + 1:] if self.prefix else k)
        return sorted(out)

    def uploads(self):
        """Multipart uploads in progress below the store's prefix: [(key, upload id)], or
        None where the server cannot list them (s3rver answers NotImplemented)."""
        try:
            r = self.s3.list_multipart_uploads(Bucket=self.bucket, Prefix=self.prefix)
        except self.s3.exceptions.ClientError as e:
            if e.response.get("Error", {}).get("Code") == "NotImplemented":
                return None
            raise
        return [(u["Key"], u["UploadId"]) for u in r.get("Uploads", [])]

    def mount_args(self, endpoint=None):
        return ["--endpoint-url", endpoint or self.server.endpoint, "--force-path-style"]

    def mount_env(self):
        return {"AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET,
                "AWS_REGION": S3_REGION}


def unique_prefix(name):
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[-40:]
    return f"t-{safe}-{uuid.uuid4().hex[:8]}"


def clean_env(extra=None, home=None):
    """The daemon's environment: ours minus AWS_* and XDG_*, with HOME set to an empty
    directory of the test's own, so neither the host's ~/.aws nor ~/.cache is used, and
    IMDS disabled (extra may enable it again, e.g. AWS_EC2_METADATA_DISABLED="")."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "XDG_"))}
    if home:
        os.makedirs(home, exist_ok=True)
        env["HOME"] = home
    env["AWS_CONFIG_FILE"] = "/nonexistent/ckptfs-it/config"
    env["AWS_SHARED_CREDENTIALS_FILE"] = "/nonexistent/ckptfs-it/credentials"
    env["AWS_EC2_METADATA_DISABLED"] = "true"  # no IMDS probe unless a test asks for one
    env.update(extra or {})
    return sanitizer_env(env)


# --------------------------------------------------------------------------- mounts


class Mount:
    """One ckptfs daemon in the foreground, mounted at a fresh mountpoint.

    Use as a context manager or call start()/close(). close() always unmounts and reaps;
    it raises HarnessError (after cleaning up) if the daemon misbehaved: non-zero exit
    after a clean unmount, had to be killed, or printed a sanitizer report.
    """

    _seq = 0

    def __init__(self, store_url, workdir, args=(), env=None, mount_timeout=None,
                 watchdog=None, cache_dir=True):
        Mount._seq += 1
        self.n = Mount._seq
        self.store_url = store_url
        self.path = os.path.join(workdir, f"mnt{self.n}")
        self.logpath = os.path.join(workdir, f"ckptfs-{self.n}.log")
        if isinstance(cache_dir, str):  # a given one: e.g. the previous mount's, to recover
            self.cache_dir = cache_dir
        else:
            self.cache_dir = os.path.join(workdir, f"cache{self.n}") if cache_dir else None
        self.args = list(args)
        self.env = clean_env(env, home=os.path.join(workdir, "home"))
        self.mount_timeout = mount_timeout or 10 * slow_factor()
        self.watchdog_s = watchdog or 240 * slow_factor()
        self.proc = None
        self.closed = False
        self.problems = []
        self._watchdog = None
        self._watchdog_fired = False
        log_level = os.environ.get("CKPTFS_LOG_LEVEL")
        if log_level:
            self.args += ["--log-level", log_level]

    # -- life cycle

    def command(self):
        cmd = [ckptfs_bin(), "-f"]
        if self.cache_dir:
            os.makedirs(self.cache_dir, exist_ok=True)
            cmd += ["--cache-dir", self.cache_dir]
        return cmd + self.args + [self.store_url, self.path]

    def start(self):
        binpath = ckptfs_bin()
        if not os.access(binpath, os.X_OK):
            raise HarnessError(f"ckptfs binary not found at {binpath}: build it or set CKPTFS_BIN")
        os.makedirs(self.path, exist_ok=True)
        cmd = self.command()
        with open(self.logpath, "ab") as log:
            log.write(("# " + " ".join(cmd) + "\n").encode())
            log.flush()
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         env=self.env, start_new_session=True)
        deadline = time.monotonic() + self.mount_timeout
        while True:
            ent = mount_entry(self.path)
            if ent and ent[0] == "fuse.ckptfs":
                break
            if ent:
                self._fail_start(f"mountpoint shows fstype {ent[0]!r}, expected 'fuse.ckptfs'")
            if self.proc.poll() is not None:
                self._fail_start(f"ckptfs exited with {self.proc.returncode} before mounting")
            if time.monotonic() > deadline:
                self._fail_start(f"not mounted within {self.mount_timeout:.0f} s")
            time.sleep(0.05)
        self._watchdog = threading.Timer(self.watchdog_s, self._fire_watchdog)
        self._watchdog.daemon = True
        self._watchdog.start()
        return self

    def _fail_start(self, why):
        try:
            self.close(expect_rc=None, with_log=False)
        except HarnessError as e:
            why += f"; {e}"
        raise HarnessError(f"mount of {self.store_url} failed: {why}\n"
                           f"command: {' '.join(self.command())}\n"
                           f"--- ckptfs log tail ({self.logpath}) ---\n{tail(self.logpath)}")

    def _fire_watchdog(self):
        # The mount lived far longer than any test should: something hangs. Killing the
        # daemon aborts the FUSE connection, so blocked syscalls in the test return.
        self._watchdog_fired = True
        if self.proc and self.proc.poll() is None:
            self.proc.kill()

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def mounted(self):
        ent = mount_entry(self.path)
        return bool(ent and ent[0] == "fuse.ckptfs")

    def _fusermount(self, *flags):
        try:
            return subprocess.run(["fusermount3", *flags, self.path], stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess([], 124, "", "fusermount3 timed out")

    def unmount(self, timeout=None):
        """Unmount (fusermount3 -u, retried; then -uz) and wait for the daemon to exit.
        Returns the daemon's exit code. Kills it by PID only if it does not exit."""
        timeout = timeout or 15 * slow_factor()
        if self._watchdog:
            self._watchdog.cancel()
        if self.proc is None:
            return None
        if self.mounted():
            ok = False
            for _ in range(20):
                r = self._fusermount("-u")
                if r.returncode == 0 or not self.mounted():
                    ok = True
                    break
                time.sleep(0.25)  # EBUSY: a straggling reader; try again
            if not ok:
                self.problems.append(f"fusermount3 -u failed: {r.stderr.strip()}; used -uz")
                self._fusermount("-uz")
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.problems.append(f"ckptfs did not exit within {timeout:.0f} s of the unmount; "
                                 f"killed pid {self.proc.pid}")
            self.proc.kill()
            rc = self.proc.wait(10)
        if self.mounted():  # daemon gone but the kernel mount stays (e.g. it crashed)
            self._fusermount("-uz")
        return rc

    def close(self, expect_rc=0, with_log=True):
        """Unmount, reap, and check. Idempotent."""
        if self.closed:
            return
        self.closed = True
        rc = self.unmount()
        try:
            with open(self.logpath, encoding="utf-8", errors="replace") as f:
                log_text = f.read()
        except OSError:
            log_text = ""
        reports = sanitizer_reports(log_text)
        if rc == 1 and not reports and "ERROR: LeakSanitizer" in log_text:
            rc = 0  # LeakSanitizer's exit status for a leak that is libfuse's own handle
        if self._watchdog_fired:
            self.problems.append(f"watchdog: mount still up after {self.watchdog_s:.0f} s, "
                                 f"daemon killed (a hang)")
        elif rc is not None and expect_rc is not None and rc != expect_rc:
            how = f"signal {-rc}" if rc < 0 else f"status {rc}"
            self.problems.append(f"ckptfs exited with {how} after unmount (expected {expect_rc})")
        if reports:
            self.problems.append("sanitizer report(s) in the daemon's stderr:\n  " + "\n  ".join(reports[:10]))
        try:
            os.rmdir(self.path)
        except OSError:
            pass
        if self.problems:
            raise HarnessError("; ".join(self.problems) + (
                f"\n--- ckptfs log tail ({self.logpath}) ---\n" + tail(self.logpath) if with_log else ""))

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
        return False

    def kill9(self):
        """Crash the daemon (SIGKILL by its PID), clear the dead mount, and reap it; the
        mount then counts as closed (a crash is what the caller asked for)."""
        if self._watchdog:
            self._watchdog.cancel()
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
        self.close(expect_rc=-9)

    # -- helpers for tests

    def p(self, rel=""):
        return os.path.join(self.path, rel) if rel else self.path

    def stats(self):
        """The mount's statistics (the user.ckptfs.stats xattr), parsed."""
        return json.loads(os.getxattr(self.path, "user.ckptfs.stats"))

    def sync(self, rel="", timeout=None):
        """Wait until everything written below rel is on the store (the
        user.ckptfs.sync xattr); raises OSError(EIO) if something failed."""
        t = (timeout or 120) * slow_factor()
        return call_with_timeout(lambda: os.getxattr(self.p(rel), "user.ckptfs.sync"), t,
                                 f"sync of {rel or '/'}")

    def sync_until_ok(self, rel="", timeout=120):
        """sync, again while it reports EIO (an upload attempt failed and is being retried
        in the background) until it succeeds; returns how many syncs failed."""
        deadline = time.monotonic() + timeout * slow_factor()
        failed = 0
        while True:
            try:
                self.sync(rel, timeout)
                return failed
            except OSError as e:
                if e.errno != errno.EIO or time.monotonic() > deadline:
                    raise
                failed += 1
                time.sleep(0.5)

    def log(self):
        with open(self.logpath, encoding="utf-8", errors="replace") as f:
            return f.read()


def stat_value(stats, name):
    """A counter from the stats JSON, at the top level or in a nested object
    (e.g. {"store": {"get_bytes": ...}}). Raises KeyError if absent."""
    if name in stats and not isinstance(stats[name], dict):
        return stats[name]
    for key in ("store", "s3", "backend"):
        if isinstance(stats.get(key), dict) and name in stats[key]:
            return stats[key][name]
    for v in stats.values():
        if isinstance(v, dict):
            try:
                return stat_value(v, name)
            except KeyError:
                pass
    raise KeyError(f"{name!r} not in stats {json.dumps(stats)[:500]}")


# --------------------------------------------------------------------------- failing runs


class CliResult:
    def __init__(self, rc, stderr, elapsed, mounted):
        self.rc, self.stderr, self.elapsed, self.mounted = rc, stderr, elapsed, mounted

    def message_lines(self):
        # "ckptfs: ..." (getopt-style messages may carry argv[0] as a path: ".../ckptfs: ...")
        return [ln for ln in self.stderr.splitlines() if re.match(r"(\S*/)?ckptfs: ", ln)]

    def __repr__(self):
        return f"rc={self.rc} elapsed={self.elapsed:.2f}s mounted={self.mounted} stderr={self.stderr!r}"


def run_cli(args, workdir, env=None, timeout=15, mountpoint=True):
    """Run `ckptfs -f ARGS [MOUNTPOINT]` that is expected to end by itself (a failing
    mount, --help). Returns CliResult. If it mounts, or runs past timeout, it is unmounted
    and killed by PID and the result says so (mounted=True / rc=None)."""
    Mount._seq += 1
    mp = os.path.join(workdir, f"mnt{Mount._seq}")
    cmd = [ckptfs_bin(), *args]
    if mountpoint:
        os.makedirs(mp, exist_ok=True)
        cmd.append(mp)
    if not os.access(cmd[0], os.X_OK):
        raise HarnessError(f"ckptfs binary not found at {cmd[0]}: build it or set CKPTFS_BIN")
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=clean_env(env, home=os.path.join(workdir, "home")),
                            start_new_session=True)
    out = {}

    def drain():
        out["stdout"], out["stderr"] = proc.communicate()

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    mounted = False
    rc = None
    while True:
        if proc.poll() is not None:
            rc = proc.returncode
            break
        if mountpoint and mount_entry(mp):
            mounted = True
            break
        if time.monotonic() - start > timeout:
            break
        time.sleep(0.05)
    elapsed = time.monotonic() - start
    if rc is None:  # mounted or hung: clean up what we started
        if mountpoint and mount_entry(mp):
            subprocess.run(["fusermount3", "-u", mp], capture_output=True, timeout=30)
            if mount_entry(mp):
                subprocess.run(["fusermount3", "-uz", mp], capture_output=True, timeout=30)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    t.join(10)
    if mountpoint:
        with contextlib.suppress(OSError):
            os.rmdir(mp)
    res = CliResult(rc, (out.get("stderr") or b"").decode("utf-8", "replace"), elapsed, mounted)
    res.stdout = (out.get("stdout") or b"").decode("utf-8", "replace")
    return res


def errno_of(fn):
    """Call fn and return the errno of the OSError it raises (None if it does not)."""
    try:
        fn()
    except OSError as e:
        return e.errno
    return None


def tree_snapshot(root):
    """{relpath: (type, mode, mtime_ns, content), or ("link", target, mtime_ns)} of
    everything below root (root's own time and mode left out: the tools that fill a
    directory set those): what rsync -a, cp -a and tar must round-trip."""
    import stat
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[os.path.relpath(p, root)] = ("link", os.readlink(p), st.st_mtime_ns)
                continue
            body = open(p, "rb").read() if stat.S_ISREG(st.st_mode) else None
            out[os.path.relpath(p, root)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode),
                                             st.st_mtime_ns, body)
    return out
