"""tests/integration/conftest.py - pytest fixtures for the ckptfs integration suite.

  s3server           session: one s3rver with a fresh data dir on a free loopback port
  dedicated_s3server function: an s3rver of the test's own, to kill/restart (fault tests)
  store              function, parametrized [s3, dir]: an empty store of the test's own
                     (an s3rver bucket prefix, or a local directory) with put()/delete()
  mounter            function: mounter(store, *args, endpoint=None, env=None) -> a started
                     Mount; every mount is unmounted and checked at teardown
  faultproxy         function: faultproxy(upstream_port, **kw) -> a started FaultProxy
  checked_mounter    function: like mounter, S3 requests pass a SigV4-checking proxy

Selecting stores: CKPTFS_IT_STORES=dir (or s3; default "s3,dir"). The binary: $CKPTFS_BIN (see harness.py).
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import harness  # noqa: E402
from faultproxy import FaultProxy  # noqa: E402


def pytest_report_header(config):
    b = harness.ckptfs_bin()
    state = "missing" if not os.path.exists(b) else ("ASan/UBSan" if harness.is_sanitized(b) else "plain")
    return f"ckptfs binary: {b} ({state})"


@pytest.fixture(scope="session")
def s3server(tmp_path_factory):
    base = tmp_path_factory.mktemp("s3rver")
    srv = harness.S3Server(str(base / "data"), bucket="ckptfs-it", logpath=str(base / "s3rver.log"))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def dedicated_s3server(tmp_path):
    srv = harness.S3Server(str(tmp_path / "s3data"), bucket="faults", logpath=str(tmp_path / "s3rver.log"))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


STORES = [s for s in os.environ.get("CKPTFS_IT_STORES", "s3,dir").split(",") if s]


@pytest.fixture(params=STORES)
def store(request, tmp_path):
    if request.param == "s3":
        srv = request.getfixturevalue("s3server")
        return harness.S3Store(srv, harness.unique_prefix(request.node.name))
    return harness.DirStore(str(tmp_path / "store"))


@pytest.fixture(params=["s3", "dir"])
def both_stores(request, tmp_path):
    """s3rver and a local directory, whatever CKPTFS_IT_STORES selects: for rules that
    differ by store (attributes as S3 metadata or the files' own, links as s3fs objects or
    real links)."""
    if request.param == "s3":
        srv = request.getfixturevalue("s3server")
        return harness.S3Store(srv, harness.unique_prefix(request.node.name))
    return harness.DirStore(str(tmp_path / "store"))


def mount_maker(workdir):
    """A mounter for one test: (make, close_all). make(store, *args, endpoint=None, env=None,
    **kw) starts a Mount in workdir; close_all() unmounts them all and fails the test if a
    daemon misbehaved."""
    mounts = []

    def make(store, *args, endpoint=None, env=None, **kw):
        extra = store.mount_args(endpoint) if isinstance(store, harness.S3Store) else store.mount_args()
        m = harness.Mount(store.url, workdir, args=[*extra, *args],
                          env={**store.mount_env(), **(env or {})}, **kw)
        mounts.append(m)
        return m.start()

    def close_all():
        problems = []
        for m in reversed(mounts):
            try:
                m.close()
            except harness.HarnessError as e:
                problems.append(str(e))
        if problems:
            pytest.fail("daemon problem at unmount:\n" + "\n\n".join(problems), pytrace=False)

    return make, close_all


@pytest.fixture
def mounter(tmp_path):
    make, close_all = mount_maker(str(tmp_path))
    yield make
    close_all()


@pytest.fixture
def faultproxy():
    proxies = []

    def make(upstream_port, **kw):
        p = FaultProxy(upstream_port, **kw).start()
        proxies.append(p)
        return p

    yield make
    for p in proxies:
        p.stop()


@pytest.fixture
def checked_mounter(mounter, faultproxy):
    """Like mounter, but an S3 store is reached through a proxy that checks every
    request's SigV4 signature as S3 does (s3rver does not). Returns (mount, proxy|None)."""

    def make(store, *args, **kw):
        if not isinstance(store, harness.S3Store):
            return mounter(store, *args, **kw), None
        proxy = faultproxy(store.server.port, credentials=(harness.S3_KEY, harness.S3_SECRET))
        return mounter(store, *args, endpoint=proxy.endpoint, **kw), proxy

    return make


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # On a failing test body, show the tails of the daemon logs of that test.
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call" and rep.failed:
        # the test's tmp_path, and the folder of any fixture value that names one as
        # `ckptfs_logdir` (chroot_mounter's mounts live inside the torch chroot)
        dirs = [item.funcargs.get("tmp_path")]
        dirs += [getattr(v, "ckptfs_logdir", None) for v in item.funcargs.values()]
        for d in dict.fromkeys(str(d) for d in dirs if d):
            if not os.path.isdir(d):
                continue
            for name in sorted(os.listdir(d)):
                if name.startswith("ckptfs-") and name.endswith(".log"):
                    rep.sections.append((f"daemon log {name} (tail)", harness.tail(os.path.join(d, name), 40)))


def pytest_terminal_summary(terminalreporter):
    # what test modules left in harness.SUMMARY (e.g. the torch 2.x blocked times)
    titles = {}
    for title, line in harness.SUMMARY:
        titles.setdefault(title, []).append(line)
    for title, lines in titles.items():
        terminalreporter.section(title.split(":")[0], sep="-")
        terminalreporter.write_line(title)
        for line in lines:
            terminalreporter.write_line(line)


# --------------------------------------------------------------------------- Ceph radosgw
# A real S3 implementation next to s3rver (see ceph.py): SigV4 checked, AWS-style
# multipart ETags. Tests that use these fixtures are skipped when Ceph is not installed.
#
#   rgw        session: one CephRGW (mon + memstore osd + radosgw) with bucket ckptfs-it,
#              started once (~2 s), stopped by PID at the end of the session
#   rgw_store  function: an RGWStore on a fresh prefix of that bucket (rgw's keys)

import ceph  # noqa: E402


@pytest.fixture(scope="session")
def rgw(tmp_path_factory):
    if not ceph.rgw_available():
        why = (f"Ceph radosgw not installed (missing {', '.join(ceph.missing_binaries())}): "
               f"run tools/setup")
        if os.environ.get("CKPTFS_REQUIRE_RGW") == "1":  # tools/test: it must run
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    srv = ceph.CephRGW(str(tmp_path_factory.mktemp("rgw")), bucket="ckptfs-it")
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def rgw_store(rgw, request):
    return rgw.store(harness.unique_prefix(request.node.name))


# The write tests run on s3rver, on radosgw (real multipart ETags, strict SigV4, and it
# can list multipart uploads: s3rver cannot) and on a local directory.
WRITE_STORES = [s for s in os.environ.get("CKPTFS_IT_WRITE_STORES", "s3,rgw,dir").split(",") if s]


@pytest.fixture(params=WRITE_STORES)
def wstore(request, tmp_path):
    if request.param == "rgw":
        return request.getfixturevalue("rgw_store")
    if request.param == "s3":
        srv = request.getfixturevalue("s3server")
        return harness.S3Store(srv, harness.unique_prefix(request.node.name))
    return harness.DirStore(str(tmp_path / "store"))


# --------------------------------------------------------------------------- torch 2.x
# torch 2.6 and 2.14 in Debian chroots (torch2.py; built by tools/setup). A test that takes
# `torch2` runs once per version; tools/test sets CKPTFS_REQUIRE_TORCH2=1 so a missing
# chroot fails instead of skipping.
#
#   torch2           session, params ["2.6", "2.14"]: an entered TorchChroot
#   chroot_mounter   function: chroot_mounter(store, *args, **kw) -> a started Mount whose
#                    mountpoint, cache and log are inside the torch2 chroot (so
#                    torch2.inside(m.p(...)) is the path a chrooted trainer uses)

import torch2 as torch2_mod  # noqa: E402

TORCH2_VERSIONS = [v for v in os.environ.get("CKPTFS_IT_TORCH2", "2.6,2.14").split(",") if v]


@pytest.fixture(scope="session", params=TORCH2_VERSIONS)
def torch2(request):
    v = request.param
    if not torch2_mod.available(v):
        why = (f"the torch {v} chroot is not built in {torch2_mod.chroots_dir()}: "
               f"run tools/setup (tools/lib/torch-chroots)")
        if os.environ.get("CKPTFS_REQUIRE_TORCH2") == "1":  # tools/test: it must run
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    ch = torch2_mod.TorchChroot(v).enter()
    try:
        yield ch
    finally:
        ch.exit()


@pytest.fixture
def chroot_mounter(torch2, request):
    work = torch2.workdir(request.node.name)
    make, close_all = mount_maker(work)
    make.ckptfs_logdir = work  # the failure report shows these daemons' logs
    yield make
    close_all()
