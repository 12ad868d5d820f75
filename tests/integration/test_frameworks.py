"""tests/integration/test_frameworks.py - Hugging Face Trainer and Accelerate as clients.

Real frameworks (transformers 5.12, accelerate 1.14 on torch 2.14, in the forky chroot:
torch2.py) save and load through ckptfs mounts, with a tiny GPT-2 built from a config and
random token data (tools/lib/hf_trainer_run.py; nothing is downloaded).

  * Trainer, save_steps=5, save_total_limit=2: its rotation deletes the oldest checkpoint
    BY MTIME (transformers falls back to step numbers only when the checkpoints' mtimes
    span < 1 s, so the saves here are > 1 s apart). After each save exactly the newest two
    remain (an earlier defect made directory mtimes wrong and the newest were deleted),
    `ls -t` lists them newest first on the writing mount and on another mount, and the
    store holds only those. (Each checkpoint is let reach the store before the > 1 s gap,
    so s3rver's whole-second times order them on the other mount; the rotation itself
    still runs while the newest checkpoint is only staged.) Then the run resumes (resume_from_checkpoint=True) through a
    fresh mount with an empty cache: it starts at step 20 from the saved weights, its
    rotation is right again, and its final weights equal those of an uninterrupted run of
    the same steps on local disk (model, optimizer, scheduler, RNG and data position all
    came back).
  * Accelerate save_state/load_state (automatic checkpoint naming, total_limit=2) of the
    model, optimizer and scheduler, loaded through a fresh mount and compared.

One chroot process serves every run of this module (importing transformers costs
seconds). Only torch 2.14 has these libraries: the tests take the torch2 fixture for 2.14
only. Under ASan (pytest -m "not matrix") the s3rver/staged and dir/remote Trainer cases
and one Accelerate case run.
"""

import json
import os
import queue
import subprocess
import threading
import time

import pytest

import harness

ROOT = harness.REPO_ROOT
RUNNER = os.path.join(ROOT, "tools", "lib", "hf_trainer_run.py")
VERSION = "2.14"  # the chroot with transformers and accelerate (forky)
VERSIONS = [v for v in os.environ.get("CKPTFS_IT_TORCH2", "2.6,2.14").split(",") if v]
WRITE_STORES = [s for s in os.environ.get("CKPTFS_IT_WRITE_STORES", "s3,rgw,dir").split(",") if s]

SAVE_STEPS, LIMIT = 5, 2
ATTR_TIMEOUT = 1.0  # ckptfs's default --attr-timeout
FIRST_STEPS, TOTAL_STEPS = 20, 30

# only the 2.14 chroot (an empty list skips the test when CKPTFS_IT_TORCH2 leaves it out)
only_forky = pytest.mark.parametrize("torch2", [VERSION] if VERSION in VERSIONS else [],
                                     indirect=True, scope="session")


class HFRunner:
    """tools/lib/hf_trainer_run.py serve, in the chroot: one JSON request, one answer."""

    def __init__(self, chroot, logpath):
        self.chroot = chroot
        self.logpath = logpath
        self.lines = queue.Queue()
        self._reference = None
        script = chroot.inside_copy(RUNNER)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
               "USE_LIBUV": "0", "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
        with open(logpath, "ab") as log:
            self.proc = subprocess.Popen(
                ["/usr/sbin/chroot", chroot.root, "/usr/bin/python3", script, "serve"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env, text=True,
                start_new_session=True)
        threading.Thread(target=self._pump, daemon=True).start()
        t0 = time.monotonic()
        self._answer(120)
        self.startup_seconds = time.monotonic() - t0

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _answer(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise harness.HarnessError(f"hf_trainer_run gave no answer within {timeout} s:\n"
                                           f"{harness.tail(self.logpath, 40)}") from None
            if line is None:
                raise harness.HarnessError(f"hf_trainer_run exited ({self.proc.wait()}):\n"
                                           f"{harness.tail(self.logpath, 40)}")
            if line.startswith("@@ "):
                return json.loads(line[3:])

    def ask(self, timeout=300, **req):
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        r = self._answer(timeout)
        if not r["ok"]:
            raise AssertionError(f"{req['op']} failed: {r['error']}\n{r['traceback']}")
        return r

    def reference(self):
        """The final weights of an uninterrupted TOTAL_STEPS run on local disk (once)."""
        if self._reference is None:
            out = self.chroot.inside(self.chroot.workdir("reference"))
            self._reference = self.ask(op="train", output_dir=out, max_steps=TOTAL_STEPS,
                                       save_steps=SAVE_STEPS, save_total_limit=LIMIT, gap=0)
        return self._reference

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write('{"op": "quit"}\n')
                self.proc.stdin.close()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture(scope="module")
def hf(torch2, tmp_path_factory):
    runner = HFRunner(torch2, str(tmp_path_factory.mktemp("hf") / "hf_trainer_run.log"))
    try:
        yield runner
    finally:
        runner.close()


@pytest.fixture
def fw_store(request, tmp_path):
    """The store named by the test's parameter: s3 (s3rver), rgw (radosgw) or dir."""
    kind = request.param
    if kind not in WRITE_STORES:
        pytest.skip(f"store {kind} not in CKPTFS_IT_WRITE_STORES")
    if kind == "rgw":
        return request.getfixturevalue("rgw_store")
    if kind == "s3":
        srv = request.getfixturevalue("s3server")
        return harness.S3Store(srv, harness.unique_prefix(request.node.name))
    return harness.DirStore(str(tmp_path / "store"))


def case(store, fsync, matrix):
    return pytest.param(store, fsync, id=f"{store}-{fsync}",
                        marks=[pytest.mark.matrix] if matrix else [])


def ls_t(path):
    """`ls -t PATH`: names newest first (ties by name)."""
    out = subprocess.run(["ls", "-t", path], check=True, capture_output=True, text=True,
                         timeout=60).stdout
    return out.split()


def mtimes(path):
    return {n: os.stat(os.path.join(path, n)).st_mtime_ns / 1e9 for n in sorted(os.listdir(path))}


def step_of(name):
    return int(name.rsplit("-", 1)[1])


def newest_first(names):
    return sorted(names, key=step_of, reverse=True)


def stored_checkpoints(store, run):
    """The checkpoint folders the store holds below run/ (files or directory markers)."""
    return sorted({k[len(run) + 1:].split("/")[0] for k in store.keys(run + "/")} - {""},
                  key=step_of)


def files_of(mount_dir):
    return {n: os.path.getsize(os.path.join(mount_dir, n)) for n in sorted(os.listdir(mount_dir))}


def check_rotation(r, first_step, want_saves):
    """The checkpoint folders the trainer found after each save's rotation."""
    got = [(s["step"], s["dirs"]) for s in r["saves"]]
    want = [(step, [f"checkpoint-{k}" for k in keep]) for step, keep in want_saves]
    assert got == want, (f"rotation with save_total_limit={LIMIT} (checkpoints after each save, "
                         f"oldest first), run from step {first_step}: got {got}, want {want}")


def check_listing(m, run, want, what):
    """m's view of run/: exactly the want checkpoints, `ls -t` newest first."""
    path = m.p(run)
    names = sorted(os.listdir(path), key=step_of)
    assert names == want, f"{what}: {run}/ holds {names}, want {want}"
    order = ls_t(path)
    assert order == newest_first(want), (f"{what}: `ls -t` lists {order}, want newest first "
                                         f"{newest_first(want)}; mtimes {mtimes(path)}")


def check_other_mount(chroot_mounter, store, m, run, want, what):
    """Once m's writes are on the store, a second mount (fresh cache) sees the same
    checkpoints, files and `ls -t` order; so does the store itself. Its directory times
    do not move while nothing below them changes (no "now"), and match the writing
    mount's up to the store's resolution (whole seconds on s3rver)."""
    m.sync()
    other = chroot_mounter(store)
    check_listing(other, run, want, f"{what}, another mount")
    for name in want:
        assert files_of(other.p(f"{run}/{name}")) == files_of(m.p(f"{run}/{name}")), name
    theirs = mtimes(other.p(run))
    assert stored_checkpoints(store, run) == want, f"{what}: the store's checkpoints"
    time.sleep(ATTR_TIMEOUT + 0.2)  # the next stats reach the daemons, not the kernel's cache
    again = mtimes(other.p(run))
    assert again == theirs, f"{what}: another mount's directory times moved: {theirs}, then {again}"
    mine = mtimes(m.p(run))
    for name in want:
        assert abs(mine[name] - theirs[name]) < 2.0, f"{what}: {name}: {mine} here, {theirs} there"
    other.close()
    print(f"{what}: mtimes {mine} (writing mount), {theirs} (another mount)")


TRAINER_CASES = [case("s3", "staged", False), case("dir", "remote", False),
                 case("s3", "remote", True), case("dir", "staged", True),
                 case("rgw", "staged", True), case("rgw", "remote", True)]


@only_forky
@pytest.mark.parametrize("fw_store, fsync", TRAINER_CASES, indirect=["fw_store"])
def test_trainer_rotation_and_resume_through_fresh_mount(torch2, hf, chroot_mounter, fw_store,
                                                         fsync):
    run = "run"
    m = chroot_mounter(fw_store, f"--fsync={fsync}")
    out = torch2.inside(m.p(run))
    r1 = hf.ask(op="train", output_dir=out, max_steps=FIRST_STEPS, save_steps=SAVE_STEPS,
                save_total_limit=LIMIT, settle=True)
    assert r1["global_step"] == FIRST_STEPS and r1["start_step"] == 0
    check_rotation(r1, 0, [(5, [5]), (10, [5, 10]), (15, [10, 15]), (20, [15, 20])])
    check_listing(m, run, ["checkpoint-15", "checkpoint-20"], "after the first run")
    check_other_mount(chroot_mounter, fw_store, m, run, ["checkpoint-15", "checkpoint-20"],
                      "after the first run")
    m.close()  # everything staged is on the store; the next mount starts with no cache

    m2 = chroot_mounter(fw_store, f"--fsync={fsync}")
    r2 = hf.ask(op="train", output_dir=torch2.inside(m2.p(run)), max_steps=TOTAL_STEPS,
                save_steps=SAVE_STEPS, save_total_limit=LIMIT, resume=True, settle=True)
    assert r2["start_step"] == FIRST_STEPS, "resume_from_checkpoint=True did not pick checkpoint-20"
    assert r2["start_sha"] == r1["final_sha"], "the resumed weights are not the saved ones"
    assert r2["global_step"] == TOTAL_STEPS
    check_rotation(r2, FIRST_STEPS, [(25, [20, 25]), (30, [25, 30])])
    check_listing(m2, run, ["checkpoint-25", "checkpoint-30"], "after the resumed run")
    check_other_mount(chroot_mounter, fw_store, m2, run, ["checkpoint-25", "checkpoint-30"],
                      "after the resumed run")
    ref = hf.reference()
    assert r2["final_sha"] == ref["final_sha"], (
        "the run resumed through a fresh mount does not end with the weights of an "
        "uninterrupted run (model, optimizer, scheduler, RNG or data position not restored)")
    print(f"trainer {type(fw_store).__name__} --fsync={fsync}: first run {r1['seconds']:.1f} s, resumed "
          f"{r2['seconds']:.1f} s (worker start-up {hf.startup_seconds:.1f} s)")


ACCEL_CASES = [case("s3", "remote", False), case("dir", "staged", True),
               case("rgw", "staged", True)]


@only_forky
@pytest.mark.parametrize("fw_store, fsync", ACCEL_CASES, indirect=["fw_store"])
def test_accelerate_save_state_load_state_through_fresh_mount(torch2, hf, chroot_mounter,
                                                              fw_store, fsync):
    m = chroot_mounter(fw_store, f"--fsync={fsync}")
    saved = hf.ask(op="accel_save", project_dir=torch2.inside(m.p("proj")), saves=3,
                   total_limit=2)
    assert saved["dirs"] == ["checkpoint_1", "checkpoint_2"], "Accelerate's total_limit rotation"
    want_files = files_of(m.p("proj/checkpoints/checkpoint_2"))
    assert {"model.safetensors", "optimizer.bin", "scheduler.bin"} <= set(want_files)
    m.close()

    m2 = chroot_mounter(fw_store, f"--fsync={fsync}")
    assert files_of(m2.p("proj/checkpoints/checkpoint_2")) == want_files
    loaded = hf.ask(op="accel_load", project_dir=torch2.inside(m2.p("proj")), total_limit=2)
    assert loaded["before_sha"] != saved["model_sha"]  # the fresh model starts elsewhere
    assert loaded["dirs"] == ["checkpoint_1", "checkpoint_2"]
    assert (loaded["model_sha"], loaded["optim_sha"], loaded["sched"]) == \
        (saved["model_sha"], saved["optim_sha"], saved["sched"]), \
        "model, optimizer or scheduler state differs after load_state through a fresh mount"
