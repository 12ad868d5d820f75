#!/usr/bin/python3
"""Hugging Face Trainer and Accelerate as ckptfs clients: a tiny model, real checkpoints.

Runs in the torch 2.14 chroot (transformers 5.12, accelerate 1.14; tests/integration/
torch2.py), where a ckptfs mount is reached at a path inside the chroot. Nothing is
downloaded: the model is a 2-layer GPT-2 built from a config (vocabulary 128, width 32, no
dropout) and the data are random token ids from a fixed seed, so every run of the same
steps gives the same weights.

Importing transformers takes ~5-10 s, so one process serves many runs: `serve` reads one
JSON request per line on stdin and answers each with one line `@@ {JSON}` on stdout (other
lines on stdout are the libraries' own). Requests:

  {"op": "train", "output_dir": D, "max_steps": N, "save_steps": 5, "save_total_limit": 2,
   "resume": false | true | PATH, "gap": 1.05, "settle": false}
      Trainer.train() with save_strategy="steps", sleeping `gap` s after each save but the
      last (so saves are >= 1 s apart: the rotation orders checkpoints by mtime, and
      falls back to step numbers when they span < 1 s); with settle, first waiting until
      the checkpoint is on the store (the ckptfs user.ckptfs.sync xattr), so that the
      store's own times, whole seconds on s3rver, are >= 1 s apart too. Answers global_step, start_step (the step the
      run began at: the checkpoint's when resuming), start_sha (the weights when the first
      step began: the checkpoint's when resuming), final_sha, saves ([{step, dirs}]: the
      checkpoint folders left after each save's rotation, sorted by step), seconds.
  {"op": "accel_save", "project_dir": D, "saves": 3, "total_limit": 2}
      Accelerate with automatic checkpoint naming: two optimizer steps then save_state(),
      `saves` times; answers the model and optimizer state digests at the last save and
      the checkpoint folders left.
  {"op": "accel_load", "project_dir": D}
      A fresh model and optimizer (other initial weights), load_state() of the newest
      checkpoint; answers the digests (and the weights' before the load) and the folders.
  {"op": "quit"}

  hf_trainer_run.py serve
  hf_trainer_run.py once '{"op": ...}'     one request, the answer on stdout
"""
import hashlib
import json
import os
import re
import sys
import time

VOCAB, SEQ, BATCH, SAMPLES = 128, 16, 4, 64


def quiet():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers

    transformers.logging.set_verbosity_error()


def digest(tensors):
    """sha256 over named tensors in name order (values as float32 bytes)."""
    import torch

    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        if not torch.is_tensor(t):
            h.update(f"{name}={t!r}".encode())
            continue
        h.update(name.encode())
        h.update(t.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def flat_optimizer_state(opt_state):
    """An optimizer state_dict as {name: tensor or number} for digest()."""
    out = {}
    for pid, st in opt_state["state"].items():
        for k, v in st.items():
            out[f"state.{pid}.{k}"] = v
    for i, g in enumerate(opt_state["param_groups"]):
        for k, v in g.items():
            out[f"group.{i}.{k}"] = v
    return out


def tiny_model(seed):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(cfg)


def token_data():
    import torch

    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, VOCAB, (SAMPLES, SEQ), generator=g)
    return [{"input_ids": row, "labels": row.clone()} for row in ids]


def checkpoint_dirs(output_dir, prefix="checkpoint-"):
    """The checkpoint folders in output_dir, sorted by step."""
    names = [n for n in os.listdir(output_dir)
             if n.startswith(prefix) and os.path.isdir(os.path.join(output_dir, n))]
    return sorted(names, key=lambda n: int(re.findall(r"\d+", n)[-1]))


def train(req):
    from transformers import Trainer, TrainerCallback, TrainingArguments

    out_dir = req["output_dir"]
    gap = float(req.get("gap", 1.05))
    settle = bool(req.get("settle"))
    saves = []
    began = {}

    class Watch(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kw):
            if not began:
                began["step"] = state.global_step
                began["sha"] = digest(dict(model.state_dict()))

        def on_save(self, args, state, control, **kw):
            # called after the save and its rotation
            saves.append({"step": state.global_step, "dirs": checkpoint_dirs(out_dir)})
            newest = os.path.join(out_dir, f"checkpoint-{state.global_step}")
            if settle and os.path.isdir(newest):  # (a wrong rotation may have deleted it)
                os.getxattr(newest, "user.ckptfs.sync")  # on the store before the gap
            if state.global_step < state.max_steps:
                time.sleep(gap)

    args = TrainingArguments(
        output_dir=out_dir, max_steps=int(req["max_steps"]), save_strategy="steps",
        save_steps=int(req.get("save_steps", 5)), save_total_limit=req.get("save_total_limit", 2),
        per_device_train_batch_size=BATCH, learning_rate=1e-3, lr_scheduler_type="constant",
        seed=0, data_seed=0,
        use_cpu=True, report_to=[], logging_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, eval_strategy="no")
    model = tiny_model(seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=token_data(),
                      callbacks=[Watch()])
    t0 = time.monotonic()
    result = trainer.train(resume_from_checkpoint=req.get("resume") or None)
    return {"global_step": result.global_step, "start_step": began.get("step"),
            "start_sha": began.get("sha"), "final_sha": digest(dict(model.state_dict())),
            "saves": saves, "seconds": time.monotonic() - t0}


def accelerator(project_dir, total_limit):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import ProjectConfiguration

    AcceleratorState._reset_state(reset_partial_state=True)  # the Trainer made one too
    GradientState._reset_state()
    cfg = ProjectConfiguration(project_dir=project_dir, automatic_checkpoint_naming=True,
                               total_limit=total_limit)
    return Accelerator(cpu=True, project_config=cfg)


def accel_parts(acc, seed):
    import torch

    model = tiny_model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    return acc.prepare(model, opt, sched)


def accel_digests(model, opt, sched):
    return {"model_sha": digest(dict(model.state_dict())),
            "optim_sha": digest(flat_optimizer_state(opt.state_dict())),
            "sched": sched.state_dict().get("last_epoch")}


def accel_save(req):
    import torch

    acc = accelerator(req["project_dir"], req.get("total_limit", 2))
    model, opt, sched = accel_parts(acc, seed=0)
    batch = torch.stack([d["input_ids"] for d in token_data()[:BATCH]])
    t0 = time.monotonic()
    for _ in range(int(req.get("saves", 3))):
        for _ in range(2):
            loss = model(input_ids=batch, labels=batch).loss
            acc.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
        acc.save_state()
    ck = os.path.join(req["project_dir"], "checkpoints")
    return {**accel_digests(model, opt, sched), "dirs": checkpoint_dirs(ck, "checkpoint_"),
            "seconds": time.monotonic() - t0}


def accel_load(req):
    acc = accelerator(req["project_dir"], req.get("total_limit", 2))
    model, opt, sched = accel_parts(acc, seed=1)
    before = digest(dict(model.state_dict()))
    t0 = time.monotonic()
    acc.load_state()
    ck = os.path.join(req["project_dir"], "checkpoints")
    return {**accel_digests(model, opt, sched), "before_sha": before,
            "dirs": checkpoint_dirs(ck, "checkpoint_"), "seconds": time.monotonic() - t0}


OPS = {"train": train, "accel_save": accel_save, "accel_load": accel_load}


def answer(req):
    try:
        return {"ok": True, **OPS[req["op"]](req)}
    except Exception as e:  # reported to the caller, who fails its test with it
        import traceback

        return {"ok": False, "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc()}


def main():
    os.chdir("/")  # never hold a mount busy
    quiet()
    if sys.argv[1:2] == ["once"]:
        print("@@ " + json.dumps(answer(json.loads(sys.argv[2]))), flush=True)
        return 0
    print("@@ " + json.dumps({"ok": True, "ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("op") == "quit":
            break
        print("@@ " + json.dumps(answer(req)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
