"""tests/integration/ceph.py - a real S3 implementation for the suite: Ceph radosgw.

s3rver is lenient (no SigV4 checks, plain-MD5 multipart ETags). This module runs the
S3 gateway of Ceph (Debian 12's radosgw 16.2, Pacific) as a throwaway one-node
cluster: one ceph-mon, one ceph-osd on memstore (all object data in RAM), one radosgw
with the beast frontend on 127.0.0.1, no cephx, no mgr, no systemd.

What it owns:
  * CephRGW      - the three daemons (mon, osd, rgw), their config, state dir, admin
                   sockets and logs; an S3 user with fixed keys and one bucket.
                   start() returns once the bucket answers; stop() ends every daemon
                   it started by its PID (rgw, osd, then mon: SIGTERM, SIGKILL after
                   a grace period) and removes the state it created.
  * RGWStore     - harness.S3Store on an rgw bucket prefix, with the rgw's keys
                   (same put/put_many/delete/mount_args/mount_env/url/key/bucket/s3).
  * rgw_available() / missing_binaries() - whether the Ceph binaries are installed
                   (`tools/setup` installs radosgw ceph-mon ceph-osd ceph-common).

Start-up, measured on a 2-core Debian 12 VM (5 runs): 1.75-2.05 s from nothing to a
bucket that answers (CephRGW.timings: mon mkfs + start + `ceph osd new` 0.2 s, osd
mkfs + start 0.03 s, `radosgw-admin user create` 1.1 s - it waits for the OSD and
creates the first four rgw pools -, rgw answering 0.1 s, first bucket 0.3-0.5 s -
three more pools). stop() takes 0.2-0.4 s. A 1 GiB multipart upload takes ~9 s and a
single-stream 1 GiB GET ~1.5 s; the OSD's RSS is ~1.6x the data it holds.

Settings that matter (see _config()):
  * auth none everywhere (auth_cluster/service/client_required = none), plus
    ms_mon_client_mode = crc and keyring = /dev/null: without cephx and with neither
    of these two, radosgw never finishes the mon handshake ("send_auth_request
    get_initial_auth_request returned -13", retried every 3 s forever); either one
    alone is enough here, we set both.
  * paxos_propose_interval = 0.1: every pool creation waits for a paxos proposal
    (default interval 1 s); rgw creates 7 pools: start-up 14.3 s without it, 1.8 s with.
  * pool size 1 (osd_pool_default_size/min_size = 1, mon_allow_pool_size_one) with
    8 PGs per pool and osd_crush_chooseleaf_type = 0: one OSD can hold every PG.
  * osd_objectstore = memstore with memstore_device_bytes (default 8 GiB, a cap, not an
    allocation; Ceph's default is 1 GiB; the OSD refuses writes at 95 % full): a 1 GiB
    test object, a 1 GiB benchmark object and not-yet-collected garbage fit together.
    ceph-osd silently falls back to bluestore on an unknown objectstore name, so
    start() checks the type mkfs wrote.
  * short rgw_gc_* periods (5 s): deleted/overwritten objects are freed by rgw's garbage
    collector (default after 2 h) and with memstore they hold RAM until then; measured:
    a deleted 64 MiB object is gone from the data pool within ~10 s.
  * rgw_enable_lc_threads = false: the lifecycle workers (they run between 00:00 and
    06:00 UTC by default) delay rgw's exit on SIGTERM by ~4.5 s.
  * mon_cluster_log_file, log_file, admin_socket, run_dir, crash_dir, mon/osd data all
    point into the state dir: nothing is written under /var/lib/ceph or /var/log/ceph
    (the mon's default cluster log is /var/log/ceph/ceph.log).

Stdlib + boto3 only. Network: 127.0.0.1 only (mon on a free port, msgr v2; the OSD
binds 127.0.0.1 ports in 6800-7300; rgw on a free port).
"""

import atexit
import http.client
import os
import shutil
import subprocess
import tempfile
import time
import uuid

import harness

RGW_KEY = "CKPTFSRGWTESTKEY0000"
RGW_SECRET = "ckptfs-rgw-test-secret-key-000000000000"
RGW_USER = "test"
GiB = 1 << 30

# Binaries start() runs; all come with radosgw + ceph-mon + ceph-osd (+ ceph-common).
BINARIES = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph", "monmaptool")
_SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin", "/sbin", "/bin"])


def missing_binaries():
    """The Ceph binaries CephRGW needs that are not installed (empty list: all there)."""
    return [b for b in BINARIES if shutil.which(b, path=_SBIN_PATH) is None]


def rgw_available():
    """True if every binary CephRGW runs is installed (run tools/setup otherwise)."""
    return not missing_binaries()


def _which(name):
    return shutil.which(name, path=_SBIN_PATH) or name


class CephRGW:
    """A one-node Ceph cluster (mon + memstore osd) with radosgw on 127.0.0.1.

    Shaped like harness.S3Server: datadir, bucket, port, endpoint, start(), stop(),
    client(), plus key/secret (the S3 user's keys) and store(prefix).

    datadir: the state dir (config, mon store, osd meta, logs, admin sockets). If None a
    fresh temp dir is made and stop() removes all of it; if given, stop() removes what
    start() created in it except log/ (kept for post-mortems, like pytest's tmp dirs).
    """

    def __init__(self, datadir=None, bucket="ckptfs-it", port=None, key=RGW_KEY, secret=RGW_SECRET,
                 memstore_bytes=8 * GiB, conf=None):
        self._own_datadir = datadir is None
        self.datadir = os.path.abspath(datadir or tempfile.mkdtemp(prefix="ckptfs-rgw-"))
        self.bucket = bucket
        self.port = port or harness.free_port()
        self.mon_port = None
        self.key = key
        self.secret = secret
        self.memstore_bytes = memstore_bytes
        self.extra_conf = dict(conf or {})  # {"section": {"option": value or None}} over ours
        self.fsid = None
        self.conf_path = os.path.join(self.datadir, "ceph.conf")
        self.logdir = os.path.join(self.datadir, "log")
        self.rundir = None
        self._own_rundir = False
        self.procs = {}  # name -> Popen, in start order (mon, osd, rgw)
        self._made = []  # paths start() created inside a given datadir
        self.startup_seconds = None
        self.timings = {}  # start-up phase -> seconds
        self._atexit = False

    # -- addresses and clients

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    def client(self, **cfg):
        """A boto3 S3 client for this rgw (path-style, the test user's keys)."""
        return harness.s3_client(self.endpoint, key_id=self.key, secret=self.secret, **cfg)

    def store(self, prefix=None):
        """An RGWStore on prefix of this rgw's bucket."""
        return RGWStore(self, prefix)

    # -- start

    def _config(self):
        d, run, log = self.datadir, self.rundir, self.logdir
        sections = {
            "global": {
                "fsid": self.fsid,
                "mon_host": f"v2:127.0.0.1:{self.mon_port}",
                "public_addr": "127.0.0.1",
                "cluster_addr": "127.0.0.1",
                "ms_bind_ipv6": "false",
                "auth_cluster_required": "none",
                "auth_service_required": "none",
                "auth_client_required": "none",
                "auth_allow_insecure_global_id_reclaim": "true",
                # without cephx, rgw hangs in the mon handshake unless one of these two
                "ms_mon_client_mode": "crc",
                "keyring": "/dev/null",
                "run_dir": run,
                "admin_socket": f"{run}/$name.asok",
                "pid_file": "",
                "log_file": f"{log}/$name.log",
                "crash_dir": f"{d}/crash",
                "mon_cluster_log_file": f"default={log}/cluster.$channel.log cluster={log}/cluster.log",
                "osd_pool_default_size": "1",
                "osd_pool_default_min_size": "1",
                "osd_pool_default_pg_num": "8",
                "osd_pool_default_pgp_num": "8",
                "osd_crush_chooseleaf_type": "0",
                "mon_allow_pool_size_one": "true",
                "mon_allow_pool_delete": "true",
                "mon_warn_on_pool_no_redundancy": "false",
                "paxos_propose_interval": "0.1",
                "mon_data_avail_crit": "0",  # a nearly full CI disk must not stop the mon
                "mon_data_avail_warn": "1",
            },
            "mon": {"mon_data": f"{d}/mon.$id"},
            "osd": {
                "osd_data": f"{d}/osd.$id",
                "osd_objectstore": "memstore",
                "memstore_device_bytes": str(self.memstore_bytes),
            },
            # the CLIs (ceph, radosgw-admin) run as client.admin: no admin socket, so
            # concurrent CLI runs do not fight over one socket path
            "client.admin": {"admin_socket": ""},
            "client.rgw.a": {
                "rgw_frontends": f"beast endpoint=127.0.0.1:{self.port}",
                "rgw_data": f"{d}/rgw",
                "rgw_gc_obj_min_wait": "5",
                "rgw_gc_processor_period": "5",
                "rgw_gc_processor_max_time": "5",
                "rgw_enable_usage_log": "false",
                # lifecycle workers run in 00:00-06:00 UTC and hold up SIGTERM for ~5 s
                "rgw_enable_lc_threads": "false",
            },
        }
        for sec, opts in self.extra_conf.items():  # None removes one of ours
            mine = sections.setdefault(sec, {})
            for k, v in opts.items():
                if v is None:
                    mine.pop(k, None)
                else:
                    mine[k] = str(v)
        out = [f"# written by tests/integration/ceph.py for {self.datadir}\n"]
        for sec, opts in sections.items():
            out.append(f"[{sec}]\n")
            out.extend(f"{k} = {v}\n" for k, v in opts.items())
        return "".join(out)

    def _mkdir(self, path):
        os.makedirs(path, exist_ok=True)
        if not self._own_datadir:
            self._made.append(path)
        return path

    def start(self, timeout=60):
        """Create the cluster, the user and the bucket; return self once the bucket
        answers. On failure every daemon started so far is stopped and RuntimeError
        (with the log tails) is raised."""
        missing = missing_binaries()
        if missing:
            raise RuntimeError(f"Ceph binaries missing: {', '.join(missing)}: run tools/setup "
                               f"(apt-get install radosgw ceph-mon ceph-osd ceph-common)")
        if self.procs:
            raise RuntimeError("CephRGW already started")
        t0 = time.monotonic()
        deadline = t0 + timeout
        os.makedirs(self.datadir, exist_ok=True)
        self.fsid = str(uuid.uuid4())
        self.mon_port = harness.free_port()
        while self.mon_port == self.port:
            self.mon_port = harness.free_port()
        os.makedirs(self.logdir, exist_ok=True)  # kept at stop
        for sub in ("crash", "rgw", "mon.a", "osd.0"):
            self._mkdir(os.path.join(self.datadir, sub))
        # admin socket paths must fit sun_path (108 bytes)
        run = os.path.join(self.datadir, "run")
        if len(run) + len("/client.rgw.a.asok") < 100:
            self.rundir = self._mkdir(run)
        else:
            self.rundir = tempfile.mkdtemp(prefix="ckptfs-rgw-run-")
            self._own_rundir = True
        with open(self.conf_path, "w") as f:
            f.write(self._config())
        if not self._own_datadir:
            self._made.append(self.conf_path)
        if not self._atexit:
            atexit.register(self.stop)  # a safety net if the session dies without teardown
            self._atexit = True
        try:
            self._bootstrap(deadline)
        except BaseException as e:
            why = str(e)
            logs = self._log_tails()
            self.stop()
            if isinstance(e, RuntimeError):
                raise RuntimeError(f"radosgw did not start: {why}\n{logs}") from None
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def _bootstrap(self, deadline):
        conf = ["--conf", self.conf_path]
        monmap = os.path.join(self.datadir, "monmap")
        if not self._own_datadir:
            self._made.append(monmap)
        self._run([_which("monmaptool"), "--create", "--clobber", "--fsid", self.fsid,
                   "--addv", "a", f"[v2:127.0.0.1:{self.mon_port}]", monmap], deadline, "monmaptool")
        t = time.monotonic()
        self._run([_which("ceph-mon"), *conf, "--mkfs", "-i", "a", "--monmap", monmap], deadline,
                  "ceph-mon --mkfs")
        self._spawn("mon", [_which("ceph-mon"), *conf, "-i", "a", "-f"])
        osd_uuid = str(uuid.uuid4())
        # allocates the id (0); waits for the mon to form quorum
        out = self._run([_which("ceph"), *conf, "--connect-timeout", "20", "osd", "new", osd_uuid],
                        deadline, "ceph osd new")
        osd_id = out.strip()
        t = self._phase("mon", t)
        if osd_id != "0":
            raise RuntimeError(f"`ceph osd new` gave id {osd_id!r}, expected 0")
        self._run([_which("ceph-osd"), *conf, "-i", "0", "--mkfs", "--osd-uuid", osd_uuid], deadline,
                  "ceph-osd --mkfs")
        # ceph-osd falls back to bluestore (a sparse 100 GiB file here) on an unknown
        # objectstore name instead of failing: check what mkfs made
        want = self.extra_conf.get("osd", {}).get("osd_objectstore") or "memstore"
        try:
            with open(os.path.join(self.datadir, "osd.0", "type")) as f:
                got = f.read().strip()
        except OSError as e:
            got = f"<{e}>"
        if got != want:
            raise RuntimeError(f"ceph-osd --mkfs made a {got!r} OSD, not {want!r}")
        self._spawn("osd", [_which("ceph-osd"), *conf, "-i", "0", "-f"])
        t = self._phase("osd", t)
        # creates the zone/zonegroup and the first rgw pools; its writes wait until the
        # OSD is up and the PGs are active, so this also waits for the OSD
        self._run([_which("radosgw-admin"), *conf, "user", "create", "--uid", RGW_USER,
                   "--display-name", "ckptfs tests", "--access-key", self.key, "--secret", self.secret],
                  deadline, "radosgw-admin user create")
        t = self._phase("user", t)
        self._spawn("rgw", [_which("radosgw"), *conf, "-n", "client.rgw.a", "-f"])
        self._wait_http(deadline)
        t = self._phase("rgw", t)
        s3 = self.client()
        try:
            s3.create_bucket(Bucket=self.bucket)
        except Exception as e:  # BucketAlreadyOwnedByYou cannot happen: fresh cluster
            raise RuntimeError(f"create_bucket({self.bucket}) failed: {e}") from None
        while not self._bucket_answers():
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"bucket {self.bucket} does not answer HEAD with 200")
            time.sleep(0.05)
        self._phase("bucket", t)

    def _phase(self, name, since):
        now = time.monotonic()
        self.timings[name] = now - since
        return now

    def _spawn(self, name, cmd):
        out = open(os.path.join(self.logdir, f"{name}.out"), "ab")
        try:
            out.write(("# " + " ".join(cmd) + "\n").encode())
            out.flush()
            self.procs[name] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                                cwd=self.datadir, start_new_session=True)
        finally:
            out.close()

    def _check_alive(self):
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} (pid {p.pid}) exited with {p.returncode}")

    def _run(self, cmd, deadline, what):
        """Run a CLI step to completion while watching the daemons; bounded by deadline
        (the CLI is killed by its PID if it runs past it). Returns its stdout."""
        log = os.path.join(self.logdir, "setup.out")
        with open(log, "ab") as f:
            f.write(("# " + " ".join(cmd) + "\n").encode())
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, cwd=self.datadir, start_new_session=True)
        try:
            while True:
                try:
                    out, err = p.communicate(timeout=0.1)
                    break
                except subprocess.TimeoutExpired:
                    pass
                self._check_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{what} did not finish in time")
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
        with open(log, "ab") as f:  # stderr only: radosgw-admin prints the user as JSON
            f.write(err + f"# exit {p.returncode}\n".encode())
        if p.returncode != 0:
            raise RuntimeError(f"{what} exited with {p.returncode}: "
                               f"{err.decode('utf-8', 'replace').strip()[-2000:]}")
        return out.decode("utf-8", "replace")

    def _wait_http(self, deadline):
        while True:
            self._check_alive()
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", "/")
                c.getresponse().read()
                c.close()
                return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"radosgw does not answer on port {self.port}")
            time.sleep(0.05)

    def _bucket_answers(self):
        try:
            self.client().head_bucket(Bucket=self.bucket)
            return True
        except Exception:
            return False

    def _log_tails(self, n=25):
        parts = []
        names = ["setup.out", "mon.out", "mon.a.log", "osd.out", "osd.0.log", "rgw.out", "client.rgw.a.log"]
        for name in names:
            path = os.path.join(self.logdir, name)
            if os.path.exists(path):
                parts.append(f"--- {path} (tail) ---\n{harness.tail(path, n)}")
        return "\n".join(parts)

    # -- stop

    def alive(self):
        """Names of the daemons that are running."""
        return [n for n, p in self.procs.items() if p.poll() is None]

    def stop(self, grace=10):
        """Stop every daemon by its PID (rgw, osd, mon - the OSD tells the mon it is going,
        so the mon goes last): SIGTERM, SIGKILL after grace seconds. Then remove the
        state dir (or, for a given datadir, what start() made in it but log/). Idempotent."""
        for name in ("rgw", "osd", "mon"):
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            p.terminate()
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        self.procs = {}
        if self._own_rundir and self.rundir:
            shutil.rmtree(self.rundir, ignore_errors=True)
            self._own_rundir = False
        if self._own_datadir:
            shutil.rmtree(self.datadir, ignore_errors=True)
        else:
            for path in reversed(self._made):
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    try:
                        os.unlink(path)
                    except OSError:
                        pass
            self._made = []
        if self._atexit:
            atexit.unregister(self.stop)
            self._atexit = False

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


class RGWStore(harness.S3Store):
    """A prefix of a CephRGW bucket: harness.S3Store with the rgw's keys.

    kind stays "s3" (tests branch on kind == "dir"); server is the CephRGW.
    """

    kind = "s3"
    shows_partial_objects = False  # rgw makes an object visible only once it is whole

    def mount_env(self):
        return {"AWS_ACCESS_KEY_ID": self.server.key, "AWS_SECRET_ACCESS_KEY": self.server.secret,
                "AWS_REGION": harness.S3_REGION}
