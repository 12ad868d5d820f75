"""The model-based test of the write path (docs/semantics.md §1-§7; model.py has the
model, the generator, the checks and the shrinker).

test_model_random: seeded random sequences on both stores in both fsync modes, checked
after every step. A failure prints the seed, the divergence, and the shortest sequence
that still fails, as a line to paste into REGRESSIONS below.

  CKPTFS_MODEL_STEPS=N         steps per run (default 400; 150 under ASan)
  CKPTFS_MODEL_SEED=N|random   one seed for every case (default: a fixed seed per case)
  CKPTFS_MODEL_SHRINK_SECONDS  time the shrinker may take on a failure (default 300)

test_model_regression: every sequence found so far, replayed as it is.
"""

import os
import random
import time

import pytest

import harness
import model

STEPS = int(os.environ.get("CKPTFS_MODEL_STEPS", "0")) or (
    150 if harness.is_sanitized(harness.ckptfs_bin()) else 400)
SHRINK_SECONDS = float(os.environ.get("CKPTFS_MODEL_SHRINK_SECONDS", "300"))
SEEDS = {("s3", "remote"): 20_1, ("s3", "staged"): 20_2, ("dir", "remote"): 20_3,
         ("dir", "staged"): 20_4}

# Two cases run under ASan too; the other two are `matrix` (release build only).
CASES = [pytest.param(s, f, marks=() if (s, f) in (("s3", "staged"), ("dir", "remote"))
                      else pytest.mark.matrix)
         for s in ("s3", "dir") for f in ("remote", "staged")]


def seed_for(case):
    env = os.environ.get("CKPTFS_MODEL_SEED", "")
    if env == "random":
        return random.SystemRandom().randrange(1 << 31)
    return int(env) if env else SEEDS[case]


@pytest.mark.parametrize("store_kind,fsync", CASES)
def test_model_random(store_kind, fsync, tmp_path, request):
    srv = request.getfixturevalue("s3server") if store_kind == "s3" else None
    seed = seed_for((store_kind, fsync))
    t0 = time.monotonic()
    run, err = model.random_run(seed, STEPS, store_kind, fsync, str(tmp_path / "run"), srv)
    took = time.monotonic() - t0
    print(f"model {store_kind}/{fsync}: seed {seed}, {run.steps} steps in {took:.1f} s")
    if err is None:
        return
    kind = model.failure_kind(err)
    print(f"model: step {run.steps} failed: {err}\nshrinking {len(run.log)} ops ...")
    ops, tries = model.shrink(list(run.log), store_kind, fsync, str(tmp_path), kind, srv,
                              budget=SHRINK_SECONDS)
    pytest.fail(f"CKPTFS_MODEL_SEED={seed} ({store_kind}, --fsync={fsync}): {err}\n"
                f"shortest failing sequence ({len(ops)} ops, {tries} replays), for REGRESSIONS:\n"
                f"    ({store_kind!r}, {fsync!r}, {ops!r}),", pytrace=False)


# Sequences the random test found (store, fsync mode, ops). A known bug stays here with
# pytest.mark.xfail(strict=True, reason=...) until it is fixed.
REGRESSIONS = [
]


@pytest.mark.parametrize("store_kind,fsync,ops", REGRESSIONS or [pytest.param(
    None, None, None, marks=pytest.mark.skip(reason="no regression sequence yet"))])
def test_model_regression(store_kind, fsync, ops, tmp_path, request):
    srv = request.getfixturevalue("s3server") if store_kind == "s3" else None
    model.replay(ops, store_kind, fsync, str(tmp_path / "run"), srv)
