#!/usr/bin/python3
"""A real PyTorch Distributed Checkpoint workload: save and load a sharded state dict.

Used by the demo, the benchmarks and the tests. Runs N ranks (processes) with the
gloo backend on 127.0.0.1 and torch 1.13's DCP (torch.distributed._shard.checkpoint).
Tensors are ShardedTensors (torch 1.13's default planner saves plain tensors from
rank 0 only), row-sharded across ranks; every value is a deterministic function of
its fqn, so a load is verified element by element.

  dcp_workload.py save DIR --world 4 --mb 256 [--layers 8] [--per-rank] [--mixed [--size-order]]
  dcp_workload.py load DIR --world 4 --mb 256 [--layers 8] [--only PREFIX[,PREFIX...]]
      [--optim] [--replicated] [--mixed] [--shuffle SEED]   (--world may differ from the save's: a resharded load)
  dcp_workload.py save DIR --world 4 --rank-dirs DIR0,DIR1,DIR2,DIR3   (one path per rank:
      e.g. the same checkpoint directory through two mounts, as two nodes would)

Prints one JSON line: {"op", "seconds", "bytes", "world", "items", "started", "ended",
"rank_cpu_seconds"}
(seconds: the slowest rank's save/load call; started/ended: wall-clock times of the first
rank's start and the last rank's end; rank_cpu_seconds: the ranks' CPU time in their calls,
summed); exits non-zero if a loaded value differs.
"""
import argparse
import dataclasses
import datetime
import json
import os
import sys
import time

import rankspawn


def _install_py311_shim():
    """torch 1.13 on Python 3.11 fails to import torch.distributed._shard: a dataclass
    field defaults to an unhashable dataclass instance. Give that class a temporary
    __hash__ while dataclasses checks the field (in memory only)."""
    if getattr(dataclasses, "_ckptfs_shim", False):
        return
    orig = dataclasses._get_field

    def patched(cls, a_name, a_type, *args, **kwargs):
        default = cls.__dict__.get(a_name, dataclasses.MISSING)
        if isinstance(default, dataclasses.Field):
            default = default.default
        typ = type(default)
        if dataclasses.is_dataclass(typ) and typ.__hash__ is None:
            typ.__hash__ = object.__hash__
            try:
                return orig(cls, a_name, a_type, *args, **kwargs)
            finally:
                typ.__hash__ = None
        return orig(cls, a_name, a_type, *args, **kwargs)

    dataclasses._get_field = patched
    dataclasses._ckptfs_shim = True


_install_py311_shim()


# --mixed: a transformer layer's shapes, as twelfths of the layer (qkv 3, out 1, up and
# down 4 each) plus a norm weight of a few rows: items of four sizes, the smallest tiny.
MIXED_PARTS = (("attn.qkv", 3), ("attn.out", 1), ("mlp.up", 4), ("mlp.down", 4))


def layout(mb, layers, optim=False, replicated=False, mixed=False):
    """(fqn, rows, cols) of each tensor: `layers` blocks of 4 float32 matrices of one size
    (with mixed: of the sizes MIXED_PARTS gives, and a small `norm.weight` per layer);
    with optim, then an optimizer state of the same shape per matrix
    (`optim.<fqn>.exp_avg`), after the whole model as in a {"model": ..., "optim": ...}
    state dict; with replicated, first a plain (not sharded) tensor of the same shape,
    `replicated.embed.weight`: torch 1.13 saves it in rank 0's file only, and every rank
    reads it from there."""
    total = mb * 1_000_000
    per_tensor = max(total // (layers * 4), 4096)
    cols = 1024
    rows = max(per_tensor // (cols * 4), 8)
    names = [("replicated.embed.weight", rows, cols)] if replicated else []
    for i in range(layers):
        if mixed:
            unit = max(rows * 4 // 12 // 8 * 8, 8)  # rows per twelfth, a multiple of 8
            names.append((f"layers.{i}.norm.weight", 8, cols))
            names += [(f"layers.{i}.{part}.weight", unit * k, cols) for part, k in MIXED_PARTS]
            continue
        for part in ("attn.qkv", "attn.out", "mlp.up", "mlp.down"):
            names.append((f"layers.{i}.{part}.weight", rows, cols))
    if optim:
        names += [(f"optim.{fqn}.exp_avg", r, c) for fqn, r, c in names
                  if not fqn.startswith("replicated.")]
    return names


def full_tensor(torch, fqn, rows, cols):
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(fqn)) % (2**31)
    base = torch.arange(rows * cols, dtype=torch.int64)
    return (((base * 2654435761 + seed) % 65521).to(torch.float32) / 256.0).reshape(rows, cols)


def state_dict(torch, world, names, zero):
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec

    placements = [f"rank:{r}/cpu" for r in range(world)]
    sd = {}
    for fqn, rows, cols in names:
        if fqn.startswith("replicated."):
            sd[fqn] = torch.zeros(rows, cols) if zero else full_tensor(torch, fqn, rows, cols)
            continue
        st = sharded_tensor.empty(ChunkShardingSpec(dim=0, placements=placements), rows, cols)
        full = None if zero else full_tensor(torch, fqn, rows, cols)
        for shard in st.local_shards():
            if zero:
                shard.tensor.zero_()
            else:
                o, n = shard.metadata.shard_offsets[0], shard.metadata.shard_sizes[0]
                shard.tensor.copy_(full.narrow(0, o, n))
        sd[fqn] = st
    return sd


def worker(rank, world, port, args, results):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist
    from torch.distributed._shard.checkpoint import (FileSystemReader, FileSystemWriter,
                                                     load_state_dict, save_state_dict)

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=600))
    try:
        names = layout(args.mb, args.layers, args.optim, args.replicated, args.mixed)
        if args.only:
            names = [n for n in names if n[0].startswith(tuple(args.only.split(",")))]
        if args.shuffle is not None:
            import random
            random.Random(args.shuffle).shuffle(names)
        if args.size_order and args.op == "save":  # the file's layout by size, the load's not
            names.sort(key=lambda n: (n[1] * n[2], n[0]))
        path = args.rank_dirs[rank] if args.rank_dirs else args.dir
        if args.op == "save":
            sd = state_dict(torch, world, names, zero=False)
            dist.barrier()
            t0, wall0, cpu0 = time.monotonic(), time.time(), time.process_time()
            save_state_dict(sd, FileSystemWriter(path, single_file_per_rank=args.per_rank))
            cpu = time.process_time() - cpu0
            dist.barrier()
            secs = time.monotonic() - t0
            nbytes = sum(s.tensor.numel() * 4 for v in sd.values()
                         if hasattr(v, "local_shards") for s in v.local_shards())
            nbytes += sum(v.numel() * 4 for v in sd.values()  # plain: saved by rank 0
                          if not hasattr(v, "local_shards") and rank == 0)
        else:
            sd = state_dict(torch, world, names, zero=True)
            dist.barrier()
            t0, wall0, cpu0 = time.monotonic(), time.time(), time.process_time()
            load_state_dict(sd, FileSystemReader(path))
            cpu = time.process_time() - cpu0
            dist.barrier()
            secs = time.monotonic() - t0
            nbytes = 0
            for fqn, rows, cols in names:
                full = full_tensor(torch, fqn, rows, cols)
                if fqn.startswith("replicated."):
                    if not torch.equal(sd[fqn], full):
                        raise SystemExit(f"rank {rank}: {fqn} differs after load")
                    nbytes += full.numel() * 4
                    continue
                for shard in sd[fqn].local_shards():
                    o, n = shard.metadata.shard_offsets[0], shard.metadata.shard_sizes[0]
                    if not torch.equal(shard.tensor, full.narrow(0, o, n)):
                        raise SystemExit(f"rank {rank}: {fqn} differs after load")
                    nbytes += shard.tensor.numel() * 4
        results.put((rank, secs, nbytes, len(names), wall0, wall0 + secs, cpu))
    finally:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("op", choices=["save", "load"])
    ap.add_argument("dir")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--mb", type=int, default=256, help="total checkpoint size in MB")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--only", default="",
                    help="load only tensors whose fqn starts with one of these (comma-separated)")
    ap.add_argument("--optim", action="store_true",
                    help="the checkpoint has an optimizer state per matrix after the model")
    ap.add_argument("--replicated", action="store_true",
                    help="add a plain tensor that every rank loads from rank 0's file")
    ap.add_argument("--shuffle", type=int, default=None, metavar="SEED",
                    help="load the keys in a shuffled order (a different state dict order)")
    ap.add_argument("--mixed", action="store_true",
                    help="tensors of a transformer layer's sizes (MIXED_PARTS) and a small norm")
    ap.add_argument("--size-order", action="store_true",
                    help="save the tensors smallest first (a layout that is not the load order)")
    ap.add_argument("--per-rank", action="store_true",
                    help="save one file per rank (single_file_per_rank=True) instead of one per item")
    ap.add_argument("--rank-dirs", default="",
                    help="comma-separated directory per rank (default: DIR for every rank)")
    args = ap.parse_args()
    args.rank_dirs = args.rank_dirs.split(",") if args.rank_dirs else []
    if args.rank_dirs and len(args.rank_dirs) != args.world:
        ap.error("--rank-dirs needs one directory per rank")
    res, codes = rankspawn.run_ranks(worker, args.world, args)
    if any(codes) or len(res) != args.world:
        print(json.dumps({"op": args.op, "error": f"ranks exited with {codes}"}))
        return 1
    print(json.dumps({"op": args.op, "seconds": round(max(r[1] for r in res), 3),
                      "bytes": sum(r[2] for r in res), "world": args.world,
                      "items": res[0][3], "started": min(r[4] for r in res),
                      "ended": max(r[5] for r in res),
                      "rank_cpu_seconds": round(sum(r[6] for r in res), 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
