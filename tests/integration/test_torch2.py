"""The torch 2.x matrix (issue #21 item 2): torch 2.6 and 2.14 DCP through the mount.

For each (torch version, store, --fsync mode) one run of tools/lib/dcp2_workload.py in the
torch chroot saves every case with 4 gloo ranks into its own folder (DTensor state dict
over a CPU device mesh; async_save with the thread and the process checkpointer;
FileSystemWriter with 2 threads and with ZStandard; HuggingFaceStorageWriter distributed
and consolidated; use_collectives=False with one __R.metadata per rank; a checkpoint saved
twice into one folder; torch.save), while a poller lists the store. Then one run with 3
ranks loads every case through a fresh mount (fresh cache directory), and in the same
spawn a subgroup of 2 ranks loads every case again through another fresh mount: each a
resharded load, every element compared (plus a partial load of one layer, the model
without optimizer state, torch.load with weights_only=True and mmap=True).

The module-scoped fixture `run` does this once per combination; the tests below assert
per case, so a failure names the case:

  test_save_and_load[CASE]  the save and both loads of CASE (a case this torch lacks is
                            skipped with the workload's reason; 2.14 must have them all)
  test_commit_order[CASE]   no commit file in a store listing before the final version of
                            every file it names: .metadata after every .distcp of its
                            folder, __R.metadata after __R_*.distcp, a Hugging Face
                            model.safetensors.index.json after the .safetensors of its
                            weight_map (docs/semantics.md section 6)
  test_mounts_clean         every daemon exits cleanly, nothing left pending
  test_blocked_times        records the trainer's blocked time of dcp.save and
                            dcp.async_save through the mount and on the local disk of
                            the chroot (no timed assertion: printed at the end of the run)

All combinations but two are marked `matrix` (release run only, tools/test).
"""

import json
import os
import re
import time

import pytest

import harness
from storepoll import StorePoller, versions

WORKLOAD = os.path.join(harness.REPO_ROOT, "tools", "lib", "dcp2_workload.py")
SAVE_CASES = ("dtensor", "async_thread", "async_process", "threads2", "zstd", "hf",
              "hf_consolidated", "no_collectives", "overwrite", "torch_save")
# the load cases each save case is checked by (the workload's load_cases)
LOADS_OF = {"dtensor": ("dtensor", "partial_layer", "partial_model"),
            "torch_save": ("torch_load",)}
# what torch 2.6 does not have (the workload reports a skip with its reason)
MISSING = {"2.6": {"async_process", "zstd", "hf", "hf_consolidated", "no_collectives"}}
COMMIT_CASES = ("dtensor", "async_thread", "async_process", "threads2", "zstd",
                "no_collectives", "overwrite", "hf_consolidated")
TIMED = ("dtensor", "async_thread", "async_process")
ROOT = "t2"  # the folder of the run on the store and in the mounts

TORCH2_VERSIONS = [v for v in os.environ.get("CKPTFS_IT_TORCH2", "2.6,2.14").split(",") if v]
WRITE_STORES = [s for s in os.environ.get("CKPTFS_IT_WRITE_STORES", "s3,rgw,dir").split(",") if s]
# the combinations the ASan run keeps: every case on real S3 semantics (radosgw shows an
# object only whole) with uploads after the trainer's fsync; and torch 2.6 on s3rver with
# fsync waiting for the store
TELLING = {("2.14", "rgw", "staged"), ("2.6", "s3", "remote")}


def combos():
    out = []
    for v in TORCH2_VERSIONS:
        for store in WRITE_STORES:
            for fsync in ("staged", "remote"):
                marks = () if (v, store, fsync) in TELLING else (pytest.mark.matrix,)
                out.append(pytest.param(v, (store, fsync), marks=marks, id=f"{v}-{store}-{fsync}"))
    return out


pytestmark = pytest.mark.parametrize("torch2,combo", combos(), indirect=True, scope="module")


@pytest.fixture(scope="module")
def combo(request):
    return request.param


# --------------------------------------------------------------------------- commit files


def named_files(store, commit, keys):
    """The files a commit file names, relative to the store: a .metadata names every
    .distcp of its folder (DCP names each rank's __R_*.distcp), __R.metadata its rank's
    __R_*.distcp, an HF index.json the values of its weight_map."""
    folder, name = commit.rsplit("/", 1)
    if name == ".metadata":
        return [k for k in keys if k.startswith(folder + "/") and k.endswith(".distcp")
                and "/" not in k[len(folder) + 1:]]
    m = re.fullmatch(r"__(\d+)\.metadata", name)
    if m:
        return [k for k in keys if k.startswith(f"{folder}/__{m.group(1)}_")
                and k.endswith(".distcp")]
    if name.endswith(".safetensors.index.json"):
        wm = json.loads(store.get(commit))["weight_map"]
        return sorted({f"{folder}/{v}" for v in wm.values()})
    raise ValueError(commit)


def commit_files(keys, case):
    pre = f"{ROOT}/{case}/"
    return sorted(k for k in keys if k.startswith(pre) and "/" not in k[len(pre):]
                  and (k.endswith(".metadata") or k.endswith(".safetensors.index.json")))


# --------------------------------------------------------------------------- the run


class Run:
    """One combination's save and loads (what the tests assert on)."""

    def __init__(self, version, store_kind, fsync):
        self.version, self.store_kind, self.fsync = version, store_kind, fsync
        self.save = self.load = None
        self.failure = None  # the workload itself failed (no JSON): why
        self.problems = []  # daemon problems at unmount
        self.warnings = []  # the daemons' warn and error log lines
        self.stats = {}
        self.poller = None
        self.keys = {}
        self.seconds = {}
        self.ckptfs_logdir = None  # conftest shows the daemon logs of a failing test
        self.store, self.store_partial = None, False


def make_store(request, kind, tmp_path_factory, name):
    if kind == "rgw":
        return request.getfixturevalue("rgw").store(harness.unique_prefix(name))
    if kind == "s3":
        return harness.S3Store(request.getfixturevalue("s3server"), harness.unique_prefix(name))
    return harness.DirStore(str(tmp_path_factory.mktemp("t2store")))


def run_workload(ch, wl, *args):
    """Run the workload in the chroot: (its JSON or None, a message with its output)."""
    t0 = time.monotonic()
    r = ch.run([wl, *args], timeout=900 * harness.slow_factor())
    lines = r.stdout.strip().splitlines()
    res = None
    if lines:
        try:
            res = json.loads(lines[-1])
        except ValueError:
            pass
    msg = (f"{' '.join(args[:2])}: exit {r.returncode} after {time.monotonic() - t0:.1f} s\n"
           f"--- stdout (tail)\n{r.stdout[-3000:]}\n--- stderr (tail)\n{r.stderr[-6000:]}")
    if r.returncode != 0 or not res or "error" in res:
        return None, msg
    return res, msg


def mount(store, work, *args):
    extra = store.mount_args() if store.kind == "dir" else store.mount_args(None)
    return harness.Mount(store.url, work, args=[*extra, *args], env=store.mount_env()).start()


def close(m, run):
    try:
        m.close()
    except harness.HarnessError as e:
        run.problems.append(str(e))
    try:
        text = m.log()
    except OSError:
        text = ""
    run.warnings += [f"ckptfs-{m.n}.log: {ln}" for ln in text.splitlines()
                     if re.search(r"ckptfs (warn|error):", ln)]


@pytest.fixture(scope="module")
def run(torch2, combo, request, tmp_path_factory):
    store_kind, fsync = combo
    name = f"{torch2.version}-{store_kind}-{fsync}"
    r = Run(torch2.version, store_kind, fsync)
    store = make_store(request, store_kind, tmp_path_factory, name)
    work = torch2.workdir(name)
    r.ckptfs_logdir = work
    r.store, r.store_partial = store, store.shows_partial_objects
    wl = torch2.inside_copy(WORKLOAD)
    t0 = time.monotonic()

    m = mount(store, work, f"--fsync={fsync}")
    mounts = [m]
    try:
        os.makedirs(m.p(ROOT))
        local = os.path.join(work, "local")  # a folder in the chroot: the local disk
        with StorePoller(store, ROOT, interval=0.05) as poll:
            r.save, r.save_msg = run_workload(
                torch2, wl, "save", torch2.inside(m.p(ROOT)), "--world", "4",
                "--local-root", torch2.inside(local))
            try:
                m.sync(ROOT)
            except OSError as e:
                r.problems.append(f"sync of the save failed: {e!r}")
        r.seconds["save"] = time.monotonic() - t0
        r.poller = poll
        r.stats["save"] = m.stats()
        close(m, r)
        if r.save is None:
            r.failure = r.save_msg
            return r
        r.keys = {k: s for k, (s, _) in versions(store, ROOT).items()}
        saved = [c for c in SAVE_CASES if r.save["cases"].get(c, {}).get("status") == "ok"]

        t1 = time.monotonic()
        m3, m2 = mount(store, work), mount(store, work)  # fresh mounts, fresh cache dirs
        mounts += [m3, m2]
        r.load, r.load_msg = run_workload(
            torch2, wl, "load", torch2.inside(m3.p(ROOT)), "--world", "3",
            "--then-world", "2", "--then-root", torch2.inside(m2.p(ROOT)),
            "--cases", ",".join(saved))
        r.seconds["load"] = time.monotonic() - t1
        r.stats["load3"], r.stats["load2"] = m3.stats(), m2.stats()
        if r.load is None:
            r.failure = r.load_msg
    finally:
        for mm in mounts:
            close(mm, r)
        r.seconds["total"] = time.monotonic() - t0
        harness.SUMMARY.append((SUMMARY_TITLE, summary_line(r)))
    return r


SUMMARY_TITLE = ("torch 2.x through the mount: blocked/total seconds of the trainer "
                 "(mount: dtensor async_thread async_process | local disk: the same)")


def summary_line(r):
    """One line of the end-of-run table: blocked/total seconds per timed case."""
    cells = []
    for where in ("cases", "local"):
        res = (r.save or {}).get(where, {})
        for c in TIMED:
            x = res.get(c, {})
            cells.append(f"{x['blocked_s']:.3f}/{x['total_s']:.3f}" if x.get("status") == "ok"
                         else x.get("status", "-"))
    return (f"torch {r.version:<4} {r.store_kind:<3} {r.fsync:<6} | "
            + " ".join(f"{c:>13}" for c in cells)
            + f" | run {r.seconds.get('total', 0):5.1f} s")


# --------------------------------------------------------------------------- the tests


def case_result(part, case):
    if part is None:
        return None
    for key in ("cases", "then"):
        if case in part.get(key, {}):
            return part
    return None


@pytest.mark.parametrize("case", SAVE_CASES)
def test_save_and_load(run, case):
    assert run.failure is None, run.failure
    s = run.save["cases"][case]
    if s["status"] == "skip":
        if case in MISSING.get(run.version, ()):
            pytest.skip(f"torch {run.version}: {s['reason']}")
        pytest.fail(f"{case} skipped on torch {run.version}, which should have it: {s['reason']}")
    assert s["status"] == "ok", f"save of {case} failed: {s.get('errors')}\n{s.get('trace')}"
    assert case not in MISSING.get(run.version, ()), f"{case} ran on torch {run.version}: update MISSING"
    for world, key in ((3, "cases"), (2, "then")):
        for lc in LOADS_OF.get(case, (case,)):
            ld = run.load[key].get(lc)
            assert ld is not None, f"no {world}-rank load of {lc}: {sorted(run.load[key])}"
            assert ld["status"] == "ok", (f"{world}-rank load of {lc} ({case}) {ld['status']}: "
                                          f"{ld.get('errors') or ld.get('reason')}\n{ld.get('trace')}")
            assert ld["bytes"] > 0, ld


def commit_order_problems(run, case):
    poll, keys = run.poller, run.keys
    problems = []
    commits = commit_files(keys, case)
    want = {"no_collectives": 4, "hf_consolidated": 1}.get(case, 1)
    if len(commits) != want:
        return [f"{want} commit file(s) expected in {ROOT}/{case}, found {commits}"]
    for c in commits:
        named = named_files(run.store, c, keys)
        if not named:
            problems.append(f"{c} names no file on the store: {sorted(keys)}")
        t_c = poll.final_from(c)
        late = {k: (poll.final_from(k), t_c) for k in named
                if poll.final_from(k) is None or poll.final_from(k) > t_c}
        if late:
            problems.append(f"{c} (final in listing {t_c}) before the final version of "
                            f"{late} (listing numbers)")
    if not run.store_partial and case != "overwrite":
        # a store that shows objects only whole: no object ever seen at another size
        torn = {k: poll.sizes_seen(k) for k in keys if k.startswith(f"{ROOT}/{case}/")
                and any(s != keys[k] for s in poll.sizes_seen(k))}
        if case == "hf_consolidated":  # written twice by torch: a header, then the tensors
            torn = {k: v for k, v in torn.items() if "/model-" not in k}
        if torn:
            problems.append(f"objects seen at other sizes than their final one: {torn}")
    return problems


@pytest.mark.parametrize("case", COMMIT_CASES)
def test_commit_order(run, case):
    assert run.failure is None or run.save is not None, run.failure
    s = run.save["cases"][case]
    if s["status"] == "skip":
        pytest.skip(f"torch {run.version}: {s['reason']}")
    assert s["status"] == "ok", f"save of {case} failed: {s.get('errors')}"
    assert not run.poller.errors, f"listings failed: {run.poller.errors[:3]}"
    problems = commit_order_problems(run, case)
    assert not problems, "\n".join(problems)


def test_mounts_clean(run):
    assert not run.problems, "\n\n".join(run.problems)
    # a commit file ckptfs could not parse is published after this mount's files only
    unparsed = [w for w in run.warnings if "cannot parse" in w]
    assert not unparsed, "\n".join(unparsed)
    st = run.stats.get("save", {}).get("write", {})
    assert st.get("pending_files") == 0 and st.get("upload_failures") == 0, st
    assert st.get("commit_timeouts") == 0, st
    assert run.failure is None, run.failure


def test_blocked_times(run, record_property):
    """The trainer's blocked time (until save/async_save returns) and the total, through
    the mount and on the local disk; recorded, never asserted."""
    assert run.save is not None, run.failure
    out = {}
    for where in ("cases", "local"):
        for c in TIMED:
            x = run.save[where].get(c, {})
            if x.get("status") == "ok":
                out[f"{'mount' if where == 'cases' else 'local'}.{c}"] = {
                    "blocked_s": x["blocked_s"], "total_s": x["total_s"]}
    record_property("blocked_times", json.dumps(out))
    print(json.dumps({"torch": run.version, "store": run.store_kind, "fsync": run.fsync,
                      "times": out, "run_seconds": {k: round(v, 1) for k, v in run.seconds.items()},
                      "commits": run.stats.get("save", {}).get("write", {}).get("commits"),
                      "process_checkpointer_start_s": run.save.get("process_checkpointer_start_s"),
                      "daemon_warnings": run.warnings[:20]}))
