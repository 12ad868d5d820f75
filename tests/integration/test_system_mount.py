"""ckptfs as a system tool: every option as a mount option (-o NAME=VALUE), mount(8)
with `-t fuse.ckptfs`, an fstab line (`mount --fstab`), a relative mountpoint, and
--log-file in the background. Daemons started through mount(8) are found by their
mountpoint, waited for after `umount`, and killed by PID only if they do not exit."""

import errno
import os
import signal
import subprocess
import time

import pytest

import harness

MiB = 1 << 20


# ------------------------------------------------------------------ -o NAME=VALUE


def test_ckptfs_options_as_mount_options(store, mounter, tmp_path):
    """-o carries ckptfs's own options (fsync, part-size, cache-dir, ...) next to FUSE's."""
    cache = str(tmp_path / "o-cache")
    mnt = mounter(store, "-o", f"fsync=staged,part-size=5M,cache-dir={cache},default_permissions")
    assert mnt.stats()["write"]["fsync"] == "staged"
    data = harness.data(12 * MiB, 7)
    with open(mnt.p("o.bin"), "wb") as f:
        f.write(data)
    mnt.sync()
    assert store.get("o.bin") == data
    w = mnt.stats()["write"]
    assert w["part_requests"] == 3, w  # 5 + 5 + 2 MiB: part-size=5M took effect
    assert os.path.isdir(os.path.join(cache, "stage")), os.listdir(cache)


def test_fstab_words_are_ignored_and_ro_is_read_only(store, mounter):
    """Words that mount(8) and systemd add are accepted; -o read-only / ro refuse writes."""
    mnt = mounter(store, "-o", "_netdev,nofail,noauto,defaults,x-systemd.automount,"
                               "x-systemd.requires=network-online.target,read-only")
    with pytest.raises(OSError) as e:
        open(mnt.p("x"), "wb").close()
    assert e.value.errno == errno.EROFS


@pytest.mark.parametrize("opt,says", [
    ("fsync=sometimes", "bad --fsync 'sometimes'"),
    ("fsync", "needs a value"),
    ("force-path-style=yes", "takes no value"),
    ("cache-size=1K", "bad --cache-size"),
    ("no-such-option", "no-such-option"),
])
def test_bad_mount_options_fail_with_one_clear_line(tmp_path, opt, says):
    os.makedirs(tmp_path / "store")
    r = harness.run_cli([str(tmp_path / "store"), "-o", opt], str(tmp_path))
    assert not r.mounted
    assert r.rc not in (0, None), r
    assert says in r.stderr, r.stderr


# ------------------------------------------------------------------ mount(8) and fstab


def _daemon_pids(*words):
    """PIDs of ckptfs processes whose command line has all these words."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"ckptfs" and all(w.encode() in argv for w in words):
            pids.append(int(d))
    return pids


def _wait_gone(pids, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not [p for p in pids if os.path.exists(f"/proc/{p}")]:
            return True
        time.sleep(0.1)
    return False


def _store_url_and_options(store, cache_dir, log_file):
    opts = [f"cache-dir={cache_dir}", f"log-file={log_file}", "fsync=staged"]
    if isinstance(store, harness.S3Store):
        opts += [f"endpoint-url={store.server.endpoint}", "force-path-style"]
    return store.url, opts


# mount.fuse3 runs `ckptfs` through /bin/sh with the shell's default PATH (it drops
# ours), so the binary under test must be found there for the test's duration.
SYSTEM_BIN = "/usr/local/sbin/ckptfs"


@pytest.fixture
def system_mounts(tmp_path):
    """Run mount(8)/umount(8) with the binary under test as `ckptfs`; clean up what
    the test left."""
    if not os.path.exists("/sbin/mount.fuse3") and not os.path.exists("/usr/sbin/mount.fuse3"):
        pytest.skip("mount.fuse3 (Debian's fuse3) is not installed")
    if os.geteuid() != 0:
        pytest.skip("mount(8) of a FUSE type needs root here")
    binary = os.path.abspath(harness.ckptfs_bin())
    if os.path.lexists(SYSTEM_BIN):
        if os.path.realpath(SYSTEM_BIN) != binary:
            pytest.skip(f"{SYSTEM_BIN} is another ckptfs; not replacing it")
        linked = False
    else:
        os.symlink(binary, SYSTEM_BIN)
        linked = True
    made = []

    def run(argv, store, mountpoint):
        made.append(mountpoint)
        env = harness.clean_env(store.mount_env(), home=str(tmp_path / "home"))
        return subprocess.run(argv, env=env, capture_output=True, text=True,
                              timeout=60 * harness.slow_factor())

    try:
        yield run
    finally:
        if linked:
            os.unlink(SYSTEM_BIN)
        for mp in made:
            pids = _daemon_pids(mp)
            if harness.mount_entry(mp):
                subprocess.run(["umount", mp], capture_output=True)
            if not _wait_gone(pids, 60 * harness.slow_factor()):
                for p in pids:
                    os.kill(p, signal.SIGKILL)
                pytest.fail(f"ckptfs for {mp} did not exit after umount")


def _check_saved_through(store, mountpoint, log_file, via):
    data = harness.data(3 * MiB + 5, 11)
    with open(os.path.join(mountpoint, "saved.bin"), "wb") as f:
        f.write(data)
    pids = _daemon_pids(mountpoint)
    assert len(pids) == 1, pids
    r = subprocess.run(["umount", mountpoint], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # the daemon finishes its uploads, then exits by itself
    assert _wait_gone(pids, 60 * harness.slow_factor()), f"ckptfs ({via}) still running"
    assert store.get("saved.bin") == data
    with open(log_file) as f:
        log = f.read()
    assert "mounted" in log and "unmounting" in log, log
    assert not harness.sanitizer_reports(log), log


def test_mount_t_fuse_ckptfs(store, tmp_path, system_mounts):
    """`mount -t fuse.ckptfs STORE MNT -o ...`: the options reach ckptfs through
    mount.fuse3; a write lands on the store after umount."""
    mnt = str(tmp_path / "mnt")
    os.makedirs(mnt)
    log = str(tmp_path / "daemon.log")
    url, opts = _store_url_and_options(store, str(tmp_path / "cache"), log)
    r = system_mounts(["mount", "-t", "fuse.ckptfs", url, mnt, "-o", ",".join(opts)], store, mnt)
    assert r.returncode == 0, r.stderr
    assert harness.mount_entry(mnt)
    _check_saved_through(store, mnt, log, "mount -t")


def test_fstab_line(store, tmp_path, system_mounts):
    """An fstab line with _netdev,nofail and ckptfs options; `mount --fstab FILE MNT`."""
    mnt = str(tmp_path / "mnt")
    os.makedirs(mnt)
    log = str(tmp_path / "daemon.log")
    url, opts = _store_url_and_options(store, str(tmp_path / "cache"), log)
    fstab = tmp_path / "fstab"
    fstab.write_text(f"# test\n{url} {mnt} fuse.ckptfs _netdev,nofail,noauto,{','.join(opts)} 0 0\n")
    r = system_mounts(["mount", "--fstab", str(fstab), mnt], store, mnt)
    assert r.returncode == 0, r.stderr
    assert harness.mount_entry(mnt)
    _check_saved_through(store, mnt, log, "fstab")


# ------------------------------------------------------------------ detaching


def test_relative_mountpoint_and_log_file_in_background(tmp_path):
    """A background daemon started with a relative MOUNTPOINT unmounts cleanly on
    SIGTERM (it resolved the path before changing to /) and logs to --log-file."""
    store = tmp_path / "store"
    store.mkdir()
    (tmp_path / "rel" / "mnt").mkdir(parents=True)
    env = harness.clean_env(home=str(tmp_path / "home"))
    r = subprocess.run([harness.ckptfs_bin(), str(store), "rel/mnt", "--cache-dir",
                        str(tmp_path / "cache"), "--log-file", "rel/daemon.log"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    mnt = str(tmp_path / "rel" / "mnt")
    pids = _daemon_pids(str(store), "rel/mnt")
    try:
        assert r.returncode == 0, r.stderr
        assert harness.mount_entry(mnt), "not mounted"
        assert len(pids) == 1, pids
        os.kill(pids[0], signal.SIGTERM)
        assert _wait_gone(pids, 30 * harness.slow_factor())
        assert not harness.mount_entry(mnt), "a dead mount was left behind"
        with open(tmp_path / "rel" / "daemon.log") as f:
            log = f.read()
        assert f"mounted {store} on {mnt}" in log, log
        assert f"unmounting {mnt}" in log, log
    finally:
        if harness.mount_entry(mnt):
            subprocess.run(["fusermount3", "-uz", mnt])
        for p in _daemon_pids(str(store), "rel/mnt"):
            os.kill(p, signal.SIGKILL)


def test_directories_have_a_sensible_mtime(store, mounter):
    """S3 prefixes have no time of their own: directories show the mount's start (or
    the local directory's own time), never 1970."""
    store.put("d/sub/x.bin", b"x")
    before = time.time()
    mnt = mounter(store)
    for rel in ["", "d", "d/sub"]:
        st = os.stat(mnt.p(rel))
        assert st.st_mtime > before - 365 * 86400, (rel, st.st_mtime)
        assert st.st_mtime < time.time() + 60, (rel, st.st_mtime)
