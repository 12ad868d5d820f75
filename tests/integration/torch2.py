"""tests/integration/torch2.py - newer torch for the tests: Debian chroots holding torch 2.6
(trixie) and 2.14 (forky), built by tools/lib/torch-chroots (run by tools/setup).

A TorchChroot, once entered, has /proc, /sys, /dev and /dev/shm mounted inside it (what
torch and gloo need) and a work folder inside it, so that a ckptfs mount made by the host
at a path inside the chroot is the same path for a trainer run with `chroot DIR python3`.
Python files the trainer runs are copied into the chroot (inside_copy). exit() unmounts
only what enter() mounted, in reverse order.

  TORCH2 = {"2.6": "trixie", "2.14": "forky"}
  available(version) -> bool; chroots_dir() -> the cache folder
  TorchChroot(version): enter(), exit(), workdir(name) -> host path inside the chroot,
      inside(host_path) -> the same path as the chroot sees it, run(args, ...) -> CompletedProcess
"""

import os
import shutil
import subprocess
import tempfile

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RANKSPAWN = os.path.join(REPO_ROOT, "tools", "lib", "rankspawn.py")
TORCH2 = {"2.6": "trixie", "2.14": "forky"}


def chroots_dir():
    return os.environ.get("CKPTFS_CHROOTS", "/var/cache/ckptfs/chroots")


def root_of(version):
    return os.path.join(chroots_dir(), TORCH2[version])


def available(version):
    """The chroot for this torch version is built (its package record is written last)."""
    return os.path.isfile(os.path.join(root_of(version), ".ckptfs-packages"))


class TorchChroot:
    def __init__(self, version):
        self.version = version
        self.root = root_of(version)
        self.mounted = []  # what enter() mounted, in order
        self.work = None

    def enter(self):
        binds = [("proc", ["-t", "proc", "proc"]), ("sys", ["--bind", "/sys"]),
                 ("dev", ["--bind", "/dev"]), ("dev/shm", ["--bind", "/dev/shm"])]
        try:
            for rel, how in binds:
                target = os.path.join(self.root, rel)
                os.makedirs(target, exist_ok=True)
                subprocess.run(["mount", *how, target], check=True, capture_output=True)
                self.mounted.append(target)
            base = os.path.join(self.root, "ckptfs-it")
            os.makedirs(base, exist_ok=True)
            self.work = tempfile.mkdtemp(prefix="s-", dir=base)
        except Exception:
            self.exit()
            raise
        return self

    def exit(self):
        for target in reversed(self.mounted):
            r = subprocess.run(["umount", target], capture_output=True)
            if r.returncode != 0:  # busy: detach it, it goes when its last user does
                subprocess.run(["umount", "-l", target], capture_output=True)
        self.mounted = []
        if self.work:
            # only if nothing is still mounted below it (a leaked mount is reported by its test)
            with open("/proc/mounts") as f:
                busy = any(line.split()[1].startswith(self.work) for line in f)
            if not busy:
                shutil.rmtree(self.work, ignore_errors=True)
            self.work = None

    def workdir(self, name):
        """A fresh folder inside the chroot (a host path), for one test's mounts and files."""
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[-80:]
        return tempfile.mkdtemp(prefix=safe + "-", dir=self.work)

    def inside(self, host_path):
        """The path a process in the chroot uses for host_path (which must be inside it)."""
        rel = os.path.relpath(os.path.abspath(host_path), self.root)
        if rel.startswith(".."):
            raise ValueError(f"{host_path} is not inside the chroot {self.root}")
        return "/" + rel

    def inside_copy(self, host_file):
        """Copy a file (e.g. tools/lib/dcp2_workload.py) into the chroot, with
        tools/lib/rankspawn.py next to it (the workloads import it); its inside path."""
        for f in (RANKSPAWN, host_file):
            dest = os.path.join(self.work, os.path.basename(f))
            shutil.copyfile(f, dest)
        return self.inside(dest)

    def run(self, args, env=None, timeout=600, **kw):
        """Run `python3 ARGS...` in the chroot (USE_LIBUV=0: Debian's torch has no libuv)."""
        e = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
             "USE_LIBUV": "0", "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        e.update(env or {})
        return subprocess.run(["/usr/sbin/chroot", self.root, "/usr/bin/python3", *args], env=e,
                              capture_output=True, text=True, timeout=timeout, **kw)
