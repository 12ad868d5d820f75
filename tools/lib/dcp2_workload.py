#!/usr/bin/python3
"""torch 2.x Distributed Checkpoint cases, saved and loaded in one spawn of N ranks.

Runs inside a chroot with torch 2.6 or 2.14 (tests/integration/torch2.py), the torch 2.x
counterpart of dcp_workload.py: N ranks with gloo on 127.0.0.1, a DTensor state dict
sharded over a CPU device mesh (init_device_mesh("cpu", (N,)), Shard(0): what FSDP2
saves), every value a deterministic function of its case and fqn, so a load checks every
element. Each case saves into ROOT/CASE:

  dtensor          dcp.save: model (layers of different sizes, one with fewer rows than
                   ranks), an optimizer-like nested dict (a DTensor exp_avg and a plain
                   scalar `step` tensor per parameter, param_groups) and a step counter
  async_thread     dcp.async_save, the thread checkpointer; blocked time (until
                   async_save returns) and total time (until its future is done)
  async_process    dcp.async_save with AsyncCheckpointerType.PROCESS (torch >= 2.7)
  threads2         FileSystemWriter(path, thread_count=2)
  zstd             FileSystemWriter(path, _extensions=[ZStandard()]) (torch >= 2.7, zstandard)
  hf               HuggingFaceStorageWriter(path, save_distributed=True): one
                   shard-0000R-model-00001-of-00001.safetensors per rank, no index (>= 2.8)
  hf_consolidated  the same with enable_consolidation=True and two output files: the
                   shards in path/sharded, rank 0 consolidates them into
                   model-0000I-of-00002.safetensors and model.safetensors.index.json
  no_collectives   dcp.save(..., use_collectives=False): __R_*.distcp and one
                   __R.metadata per rank (torch >= 2.9)
  overwrite        dcp.save twice into the same directory, other values; a load must see
                   the second
  torch_save       rank 0: torch.save of a plain (full) state dict to model.pt

A case this torch lacks is reported {"status": "skip", "reason": ...}; a case that raised
{"status": "error", "error": ...}. The load (any world size: a resharded load) checks every
saved case, plus `partial_layer` (only one layer's keys of `dtensor`) and `partial_model`
(the model without optimizer state), `torch_load` (weights_only=True and mmap=True).

  dcp2_workload.py save ROOT --world 4 [--cases a,b] [--scale K | --mb MB --layers L]
                   [--local-root DIR] [--sync]
  dcp2_workload.py load ROOT --world 3 [--cases a,b] [--scale K | --mb MB --layers L]
                   [--then-world 2 --then-root ROOT2]

--mb MB --layers L: instead of the small model above (--scale), L layers of 4 float32
matrices (attn.qkv, attn.out, mlp.up, mlp.down; rows a multiple of --world), about MB in
all with their optimizer state (tools/demo's size). --sync (ROOT on a ckptfs mount): after
each case rank 0 waits until it is all on the store (getxattr user.ckptfs.sync on its
folder), reported as "durable_s" from the case's start.

--local-root DIR: before the cases, save the timed ones (dtensor, async_thread,
async_process) into DIR too (a local folder: the blocked times' baseline), reported under
"local". Before any of them the process checkpointer's background process is started with
a tiny save into a temporary folder (process_checkpointer_start_s), so no timed case pays
for that start. A load with --then-world W2 --then-root ROOT2 then loads every case again
in the same spawn with the first W2 ranks (a subgroup and its own device mesh) from ROOT2,
reported under "then". Prints one JSON line (the last line of stdout):
  {"op", "torch", "world", "seconds", "cases": {CASE: {"status", "blocked_s", "total_s",
   "bytes", ...}}, "local": {...}, "then": {...}, "phases": {...}}
(a load's total_s counts making the state dict and checking every value; load_s, where
the case is one dcp.load, that call alone)
exit status 0 unless a rank died (a failing case is in the JSON, not the exit status).
"""
import argparse
import datetime
import json
import os
import sys
import time
import traceback

import rankspawn

SAVE_CASES = ("dtensor", "async_thread", "async_process", "threads2", "zstd", "hf",
              "hf_consolidated", "no_collectives", "overwrite", "torch_save")
TIMED = ("dtensor", "async_thread", "async_process")
# (fqn, rows, cols): rows scale with --scale, except the norm: 6 rows over 4 ranks leaves
# the last rank an empty shard (Shard(0) gives 2, 2, 2, 0)
MODEL = (("embed.weight", 1000, 256), ("layers.0.attn.qkv.weight", 768, 256),
         ("layers.0.mlp.up.weight", 1022, 128), ("layers.1.attn.qkv.weight", 384, 256),
         ("layers.1.norm.weight", 6, 256), ("head.weight", 333, 64))
PARTIAL_LAYER = ("layers.0.attn.qkv.weight", "layers.0.mlp.up.weight")
HF_SPLIT = {"embed.weight": 1, "head.weight": 2}  # others: file 1 if layers.0, else 2


def layout(args):
    """(fqn, rows, cols) of the model: MODEL (rows x --scale), or --mb/--layers."""
    if not args.mb:
        return [(f, r if "norm" in f else r * args.scale, c) for f, r, c in MODEL]
    cols = 1024
    per_tensor = max(args.mb * 1_000_000 // (args.layers * 4 * 2), 4096)  # 2: with exp_avg
    rows = max(per_tensor // (cols * 4) // args.world * args.world, args.world)
    return [(f"layers.{i}.{part}.weight", rows, cols) for i in range(args.layers)
            for part in ("attn.qkv", "attn.out", "mlp.up", "mlp.down")]


def salt_of(case):
    return "overwrite/v2" if case == "overwrite" else case


def step_of(salt):
    return 1000 + sum(ord(c) for c in salt)


def full_tensor(torch, salt, fqn, rows, cols):
    key = f"{salt}/{fqn}"
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(key)) % (2**31)
    base = torch.arange(rows * cols, dtype=torch.int64)
    return (((base * 2654435761 + seed) % 65521).to(torch.float32) / 256.0).reshape(rows, cols)


class Ctx:
    """What a rank's cases share: torch, the mesh, this rank and world (of group: None is
    the default group)."""

    def __init__(self, torch, mesh, rank, world, names, group=None):
        self.torch, self.mesh, self.rank, self.world = torch, mesh, rank, world
        self.group = group
        self.names = names
        from torch.distributed.tensor import Shard, distribute_tensor
        self.Shard, self.distribute_tensor = Shard, distribute_tensor

    def dt(self, salt, fqn, rows, cols, zero=False):
        t = self.torch.zeros(rows, cols) if zero else full_tensor(self.torch, salt, fqn, rows, cols)
        return self.distribute_tensor(t, self.mesh, [self.Shard(0)])

    def model(self, salt, zero=False, only=None):
        return {f: self.dt(salt, f, r, c, zero) for f, r, c in self.names
                if only is None or f in only}

    def state(self, salt, zero=False, model_only=False, only=None):
        model = self.model(salt, zero, only)
        sd = {"model": model}
        if model_only:
            return sd
        step = step_of(salt)
        sd["optim"] = {
            "state": {f: {"exp_avg": self.dt(salt, f"optim.{f}.exp_avg", r, c, zero),
                          "step": self.torch.tensor(0.0 if zero else float(step))}
                      for f, r, c in self.names if f in model},
            "param_groups": [{"lr": 0.0 if zero else 3e-4, "weight_decay": 0.0 if zero else 0.1,
                              "params": [] if zero else sorted(model)}],
        }
        sd["step"] = -1 if zero else step
        return sd


def local_slice(ctx, dt, full):
    """The rows of full this rank's shard of dt holds."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    shape, offset = compute_local_shape_and_global_offset(full.shape, ctx.mesh, [ctx.Shard(0)])
    return full.narrow(0, offset[0], shape[0])


def check_state(ctx, sd, salt, model_only=False, only=None):
    """Compare a loaded state dict (DTensors) with the values saved under salt."""
    torch = ctx.torch
    step = step_of(salt)
    bad = []
    n = 0
    for f, r, c in ctx.names:
        if only is not None and f not in only:
            continue
        pairs = [(f, sd["model"][f], full_tensor(torch, salt, f, r, c))]
        if not model_only:
            pairs.append((f"optim.{f}.exp_avg", sd["optim"]["state"][f]["exp_avg"],
                          full_tensor(torch, salt, f"optim.{f}.exp_avg", r, c)))
            if float(sd["optim"]["state"][f]["step"]) != float(step):
                bad.append(f"optim.state.{f}.step={float(sd['optim']['state'][f]['step'])}")
        for name, dt, full in pairs:
            local = dt.to_local()
            want = local_slice(ctx, dt, full)
            n += local.numel() * local.element_size()
            if local.shape != want.shape or not torch.equal(local, want):
                bad.append(name)
    if not model_only:
        if sd["step"] != step:
            bad.append(f"step={sd['step']!r} (want {step})")
        pg = sd["optim"]["param_groups"][0]
        want_names = sorted(f for f, _, _ in ctx.names if only is None or f in only)
        if pg.get("lr") != 3e-4 or pg.get("weight_decay") != 0.1 or list(pg.get("params")) != want_names:
            bad.append(f"param_groups={pg!r}")
    if bad:
        raise AssertionError(f"rank {ctx.rank}: values differ after load: {bad[:8]}")
    return n


def saved_bytes(ctx, sd):
    """Bytes of tensor data this rank holds (its shards; plain tensors on rank 0)."""
    n = 0
    stack = [sd]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif hasattr(v, "to_local"):
            loc = v.to_local()
            n += loc.numel() * loc.element_size()
        elif isinstance(v, ctx.torch.Tensor) and ctx.rank == 0:
            n += v.numel() * v.element_size()
    return n


class Skip(Exception):
    pass


def feature(ok, why):
    if not ok:
        raise Skip(why)


# --------------------------------------------------------------------------- save cases


def wait_future(fut):
    if hasattr(fut, "upload_completion"):  # AsyncSaveResponse (a stager with async staging)
        fut.staging_completion.result()
        return fut.upload_completion.result()
    return fut.result()


def save_case(ctx, case, path, sync=False):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    import torch.distributed.checkpoint.state_dict_saver as saver

    torch = ctx.torch
    out = {}
    sd = None
    if case in ("dtensor", "async_thread", "async_process", "threads2", "zstd",
                "no_collectives", "overwrite"):
        sd = ctx.state(salt_of(case) if case != "overwrite" else "overwrite/v1")
    elif case in ("hf", "hf_consolidated"):
        feature(os.path.exists(os.path.join(os.path.dirname(dcp.__file__), "hf_storage.py")),
                f"torch {torch.__version__} has no torch.distributed.checkpoint.hf_storage")
        sd = ctx.model(case)
    if case == "async_process":
        feature(hasattr(saver, "AsyncCheckpointerType"),
                f"torch {torch.__version__} has no AsyncCheckpointerType (process checkpointer)")
    if case == "zstd":
        try:
            from torch.distributed.checkpoint._extension import ZStandard
        except ImportError:
            raise Skip(f"torch {torch.__version__} has no torch.distributed.checkpoint._extension")
        feature(ZStandard.is_available(), "neither zstandard nor pyzstd is installed")
    if case == "no_collectives":
        import inspect
        feature("use_collectives" in inspect.signature(dcp.save).parameters,
                f"torch {torch.__version__}: dcp.save has no use_collectives")

    ctx.torch.distributed.barrier(group=ctx.group)
    t0 = time.monotonic()
    out["started"] = time.time()
    if case == "dtensor":
        dcp.save(sd, checkpoint_id=path)
    elif case in ("async_thread", "async_process"):
        kw = {}
        if case == "async_process":
            kw["async_checkpointer_type"] = saver.AsyncCheckpointerType.PROCESS
        fut = dcp.async_save(sd, checkpoint_id=path, **kw)
        out["blocked_s"] = time.monotonic() - t0
        wait_future(fut)
    elif case == "threads2":
        dcp.save(sd, storage_writer=FileSystemWriter(path, thread_count=2))
    elif case == "zstd":
        dcp.save(sd, storage_writer=FileSystemWriter(path, _extensions=[ZStandard()]))
    elif case == "no_collectives":
        dcp.save(sd, checkpoint_id=path, use_collectives=False)
    elif case == "overwrite":
        dcp.save(sd, checkpoint_id=path)
        sd = ctx.state("overwrite/v2")
        ctx.torch.distributed.barrier(group=ctx.group)
        dcp.save(sd, checkpoint_id=path)
    elif case == "hf":
        from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter
        dcp.save(sd, storage_writer=HuggingFaceStorageWriter(path, save_distributed=True))
    elif case == "hf_consolidated":
        from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter
        mapping = {f: HF_SPLIT.get(f, 1 if f.startswith("layers.0.") else 2) for f in sd}
        dcp.save(sd, storage_writer=HuggingFaceStorageWriter(
            path, save_distributed=True, enable_consolidation=True, fqn_to_index_mapping=mapping))
    elif case == "torch_save":
        if ctx.rank == 0:
            os.makedirs(path, exist_ok=True)
            plain = {f: full_tensor(torch, case, f, r, c) for f, r, c in ctx.names}
            plain["step"] = step_of(case)
            torch.save(plain, os.path.join(path, "model.pt"))
            sd = plain
        else:
            sd = {}
    else:
        raise ValueError(f"unknown case {case}")
    out.setdefault("blocked_s", time.monotonic() - t0)
    out["total_s"] = time.monotonic() - t0
    out["bytes"] = saved_bytes(ctx, sd)
    if sync and ctx.rank == 0:  # until the mount has all of it on the store
        os.getxattr(path, "user.ckptfs.sync")
        out["durable_s"] = time.monotonic() - t0
    return out


# --------------------------------------------------------------------------- load cases


def rank_reader(FileSystemReader, path, saved_rank):
    """A FileSystemReader of one rank's own __R.metadata (a use_collectives=False save)."""

    class RankReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            return super().read_metadata(rank=saved_rank)

    return RankReader(path)


def load_no_collectives(ctx, path, saved_world):
    """A use_collectives=False checkpoint has one metadata per saving rank naming only that
    rank's shards, and dcp.load reads only the loading rank's own __R.metadata: it is made
    for a load at the world size that saved it. Check it at any world size: each loading
    rank reads some saving ranks' metadata (no_dist) into full-size plain tensors and
    compares the chunks that metadata names; together they must cover every row of every
    tensor."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    torch = ctx.torch
    salt = "no_collectives"
    covered = {}
    n = 0
    for s in range(ctx.rank, saved_world, ctx.world):
        reader = rank_reader(FileSystemReader, path, s)
        md = reader.read_metadata()
        sd = {"model": {f: torch.full((r, c), float("nan")) for f, r, c in ctx.names},
              "optim": {"state": {f: {"exp_avg": torch.full((r, c), float("nan")),
                                      "step": torch.tensor(0.0)} for f, r, c in ctx.names},
                        "param_groups": [{"lr": 0.0, "weight_decay": 0.0, "params": []}]},
              "step": -1}
        dcp.load(sd, storage_reader=reader, no_dist=True)
        bad = []
        for f, r, c in ctx.names:
            for fqn, t, full in ((f"model.{f}", sd["model"][f], full_tensor(torch, salt, f, r, c)),
                                 (f"optim.state.{f}.exp_avg", sd["optim"]["state"][f]["exp_avg"],
                                  full_tensor(torch, salt, f"optim.{f}.exp_avg", r, c))):
                for ch in md.state_dict_metadata[fqn].chunks:
                    o, k = ch.offsets[0], ch.sizes[0]
                    if not torch.equal(t.narrow(0, o, k), full.narrow(0, o, k)):
                        bad.append(f"{fqn}[{o}:{o + k}] of __{s}.metadata")
                    covered.setdefault(fqn, set()).update(range(o, o + k))
                    n += k * c * 4
        if sd["step"] != step_of(salt):
            bad.append(f"step={sd['step']} in __{s}.metadata")
        if bad:
            raise AssertionError(f"rank {ctx.rank}: values differ after load: {bad[:8]}")
    # every row of every tensor is in some rank's metadata
    allcov = [None] * ctx.world
    dist.all_gather_object(allcov, {k: sorted(v) for k, v in covered.items()}, group=ctx.group)
    if ctx.rank == 0:
        rows = {f: r for f, r, _ in ctx.names}
        merged = {}
        for part in allcov:
            for k, v in part.items():
                merged.setdefault(k, set()).update(v)
        for f, r in rows.items():
            for fqn in (f"model.{f}", f"optim.state.{f}.exp_avg"):
                if merged.get(fqn, set()) != set(range(r)):
                    raise AssertionError(f"rows of {fqn} in no rank's metadata: "
                                         f"{sorted(set(range(r)) - merged.get(fqn, set()))[:10]}")
    return n


def timed_load(dcp, sd, out, **kw):
    """dcp.load(sd, **kw); its seconds (the load alone, without making sd or checking it)
    into out["load_s"]."""
    t0 = time.monotonic()
    dcp.load(sd, **kw)
    out["load_s"] = time.monotonic() - t0


def load_case(ctx, case, path, saved_world):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    torch = ctx.torch
    if not os.path.isdir(path):
        raise Skip(f"not saved: no {path}")
    if case in ("hf", "hf_consolidated"):
        feature(os.path.exists(os.path.join(os.path.dirname(dcp.__file__), "hf_storage.py")),
                f"torch {torch.__version__} has no torch.distributed.checkpoint.hf_storage")
    pg = {"process_group": ctx.group}
    out = {}
    ctx.torch.distributed.barrier(group=ctx.group)
    t0 = time.monotonic()
    if case in ("dtensor", "async_thread", "async_process", "threads2", "zstd", "overwrite"):
        sd = ctx.state("x", zero=True)
        timed_load(dcp, sd, out, storage_reader=FileSystemReader(path), **pg)
        n = check_state(ctx, sd, salt_of(case))
    elif case == "partial_layer":
        sd = ctx.state("x", zero=True, model_only=True, only=PARTIAL_LAYER)
        timed_load(dcp, sd, out, checkpoint_id=path, **pg)
        n = check_state(ctx, sd, "dtensor", model_only=True, only=PARTIAL_LAYER)
    elif case == "partial_model":
        sd = ctx.state("x", zero=True, model_only=True)
        timed_load(dcp, sd, out, checkpoint_id=path, **pg)
        n = check_state(ctx, sd, "dtensor", model_only=True)
    elif case in ("hf", "hf_consolidated"):
        from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader
        sd = ctx.model("x", zero=True)
        timed_load(dcp, sd, out, storage_reader=HuggingFaceStorageReader(path), **pg)
        n = check_state(ctx, {"model": sd}, case, model_only=True)
        if case == "hf_consolidated":
            with open(os.path.join(path, "model.safetensors.index.json")) as f:
                wm = json.load(f)["weight_map"]
            want = {f: f"model-0000{HF_SPLIT.get(f, 1 if f.startswith('layers.0.') else 2)}"
                       f"-of-00002.safetensors" for f, _, _ in ctx.names}
            if wm != want:
                raise AssertionError(f"index.json weight_map {wm} != {want}")
    elif case == "no_collectives":
        n = load_no_collectives(ctx, path, saved_world)
    elif case == "torch_load":
        n = 0
        pt = os.path.join(path, "model.pt")
        how = []
        if ctx.rank == 0:
            how.append(dict(weights_only=True))
        if ctx.rank == ctx.world - 1:
            how.append(dict(mmap=True, weights_only=True))
        for kw in how:
            back = torch.load(pt, **kw)
            if back.get("step") != step_of("torch_save"):
                raise AssertionError(f"torch.load({kw}): step={back.get('step')}")
            for f, r, c in ctx.names:
                if not torch.equal(back[f], full_tensor(torch, "torch_save", f, r, c)):
                    raise AssertionError(f"torch.load({kw}): {f} differs")
                n += r * c * 4
    else:
        raise ValueError(f"unknown load case {case}")
    return {**out, "total_s": time.monotonic() - t0, "bytes": n}


LOAD_DIR = {"partial_layer": "dtensor", "partial_model": "dtensor", "torch_load": "torch_save"}


def load_cases(saved):
    out = []
    for c in saved:
        if c == "torch_save":
            out.append("torch_load")
        else:
            out.append(c)
        if c == "dtensor":
            out += ["partial_layer", "partial_model"]
    return out


# --------------------------------------------------------------------------- ranks


def run_one(ctx, fn, *args):
    """One case on this rank: its result, a skip or the error (all ranks agree on skips)."""
    try:
        res = fn(ctx, *args)
        res["status"] = "ok"
    except Skip as e:
        res = {"status": "skip", "reason": str(e)}
    except Exception as e:  # noqa: BLE001 - reported per case
        res = {"status": "error", "error": f"rank {ctx.rank}: {type(e).__name__}: {e}",
               "trace": traceback.format_exc()[-3000:]}
    try:
        ctx.torch.distributed.barrier(group=ctx.group)
    except Exception as e:  # noqa: BLE001
        res = {"status": "error", "error": f"rank {ctx.rank}: barrier after the case: {e}"}
        raise SystemExit(json.dumps(res))
    return res


def warm_process_checkpointer(ctx, scratch):
    """Start the process checkpointer's background process (spawned and joined to its own
    gloo group at the first PROCESS async_save) with a tiny save into a scratch folder,
    so the timed cases measure the save and not that start. Its seconds, or None."""
    import torch.distributed.checkpoint as dcp
    import torch.distributed.checkpoint.state_dict_saver as saver
    if not hasattr(saver, "AsyncCheckpointerType"):
        return None
    ctx.torch.distributed.barrier(group=ctx.group)
    t0 = time.monotonic()
    fut = dcp.async_save({"warmup": ctx.torch.zeros(4)}, checkpoint_id=scratch,
                         async_checkpointer_type=saver.AsyncCheckpointerType.PROCESS)
    wait_future(fut)
    return time.monotonic() - t0


def stop_process_checkpointer():
    """End the process checkpointer's background process (if one was started)."""
    try:
        import torch.distributed.checkpoint._async_process_executor as ape
    except ImportError:
        return
    proc = getattr(ape, "_CHECKPOINT_PROCESS", None)
    if proc is None:
        return
    ape._CHECKPOINT_PROCESS = None
    try:
        proc._send(ape._CheckpointSaveProcessControlOpts.TERMINATE)
    except (OSError, AttributeError):
        pass
    proc._save_process.join(2)
    if proc._save_process.is_alive():  # its gloo teardown can linger: it saved all it had
        proc._save_process.terminate()
        proc._save_process.join(5)


def worker(rank, world, port, args, results):
    marks = [("start", time.time())]
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
    os.environ["LOCAL_RANK"] = str(rank)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    marks.append(("import", time.time()))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=args.timeout))
    marks.append(("init_process_group", time.time()))
    out = {"cases": {}, "local": {}, "then": {}}
    try:
        mesh = init_device_mesh("cpu", (world,))
        ctx = Ctx(torch, mesh, rank, world, layout(args))
        marks.append(("mesh", time.time()))
        if args.op == "save":
            if "async_process" in args.cases:
                import tempfile
                with tempfile.TemporaryDirectory(prefix="dcp2-warmup-") as scratch:
                    out["process_checkpointer_start_s"] = warm_process_checkpointer(ctx, scratch)
            if args.local_root:
                for case in [c for c in TIMED if c in args.cases]:
                    out["local"][case] = run_one(ctx, save_case, case,
                                                 os.path.join(args.local_root, case))
            for case in args.cases:
                out["cases"][case] = run_one(ctx, save_case, case, os.path.join(args.root, case),
                                             args.sync)
        else:
            for case in load_cases(args.cases):
                path = os.path.join(args.root, LOAD_DIR.get(case, case))
                out["cases"][case] = run_one(ctx, load_case, case, path, args.saved_world)
            if args.then_world:
                # a second, smaller world in the same spawn: a subgroup of the first ranks
                # loads every case again from --then-root (e.g. another fresh mount)
                from torch.distributed.device_mesh import DeviceMesh
                group = dist.new_group(list(range(args.then_world)))
                if rank < args.then_world:
                    mesh2 = DeviceMesh.from_group(group, "cpu")
                    ctx2 = Ctx(torch, mesh2, dist.get_rank(group), args.then_world, layout(args),
                               group=group)
                    for case in load_cases(args.cases):
                        path = os.path.join(args.then_root, LOAD_DIR.get(case, case))
                        out["then"][case] = run_one(ctx2, load_case, case, path, args.saved_world)
                dist.barrier()
        marks.append(("cases", time.time()))
        stop_process_checkpointer()
        marks.append(("stop", time.time()))
        out["torch"] = torch.__version__
        out["phases"] = {k: round(t - marks[i][1], 3) for i, (k, t) in enumerate(marks[1:])}
        results.put((rank, out))
    finally:
        dist.destroy_process_group()


def merge(per_rank):
    """One result per case from every rank's: ok if all are, else the first error."""
    merged = {}
    for key in ("cases", "local", "then"):
        merged[key] = {}
        for case in per_rank[0][key]:
            rs = [pr[key][case] for pr in per_rank if case in pr[key]]
            errs = [r for r in rs if r["status"] == "error"]
            skips = [r for r in rs if r["status"] == "skip"]
            if errs:
                m = dict(errs[0])
                m["errors"] = [r["error"] for r in errs]
            elif skips:
                m = {"status": "skip", "reason": skips[0]["reason"]}
            else:
                m = {"status": "ok", "total_s": round(max(r["total_s"] for r in rs), 3),
                     "bytes": sum(r["bytes"] for r in rs)}
                if all("started" in r for r in rs):  # wall clock: the first rank's start
                    m["started"] = round(min(r["started"] for r in rs), 3)
                for k in ("blocked_s", "durable_s", "load_s"):  # durable_s: rank 0's only
                    if any(k in r for r in rs):
                        m[k] = round(max(r[k] for r in rs if k in r), 3)
            merged[key][case] = m
    return merged


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("op", choices=["save", "load"])
    ap.add_argument("root", help="the folder holding one checkpoint folder per case")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--saved-world", type=int, default=4,
                    help="load: the world size of the save (for no_collectives)")
    ap.add_argument("--cases", default=",".join(SAVE_CASES),
                    help=f"comma-separated, of {','.join(SAVE_CASES)} (the save's names also "
                         f"for a load)")
    ap.add_argument("--scale", type=int, default=1, help="multiply the tensors' rows")
    ap.add_argument("--mb", type=int, default=0,
                    help="instead: a model of --layers layers, about MB with its optimizer state")
    ap.add_argument("--layers", type=int, default=8, help="with --mb: layers of 4 matrices")
    ap.add_argument("--sync", action="store_true",
                    help="save: after each case wait until it is on the store (a ckptfs mount)")
    ap.add_argument("--local-root", default="",
                    help="save: also save the timed cases into this local folder first")
    ap.add_argument("--then-world", type=int, default=0,
                    help="load: then load again with this many ranks (a subgroup)")
    ap.add_argument("--then-root", default="", help="load: the root of the --then-world load")
    ap.add_argument("--timeout", type=int, default=300, help="gloo collective timeout (s)")
    args = ap.parse_args()
    args.cases = [c for c in args.cases.split(",") if c]
    if args.then_world and not (args.op == "load" and 0 < args.then_world <= args.world):
        ap.error("--then-world: a load's second world, at most --world ranks")
    args.then_root = args.then_root or args.root
    unknown = [c for c in args.cases if c not in SAVE_CASES]
    if unknown:
        ap.error(f"unknown cases {unknown}")
    t0 = time.monotonic()
    got, codes = rankspawn.run_ranks(worker, args.world, args)
    head = {"op": args.op, "torch": got[0][1]["torch"] if got else None, "world": args.world,
            "seconds": round(time.monotonic() - t0, 3)}
    if args.then_world:
        head["then_world"] = args.then_world
    if any(codes) or len(got) != args.world:
        print(json.dumps({**head, "error": f"ranks exited with {codes}"}))
        return 1
    got.sort(key=lambda g: g[0])
    extra = {"phases": got[0][1]["phases"]}
    starts = [g[1].get("process_checkpointer_start_s") for g in got]
    if any(x is not None for x in starts):
        extra["process_checkpointer_start_s"] = round(max(x for x in starts if x is not None), 3)
    print(json.dumps({**head, **merge([g[1] for g in got]), **extra}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
