#!/usr/bin/python3
"""A simulated many-rank torch 1.13 DCP save and load: the files, the order and the real
`.metadata`, without a torch process per rank.

What it owns: the file-system side of torch 1.13's FileSystemWriter / FileSystemReader
for N ranks (thousands), driven from a few worker processes per mount:

  * build(ranks, tensors, layout, item_bytes) -> Sim: `tensors` row-sharded float32
    tensors ("layers.{i//4}.{attn.qkv,attn.out,mlp.up,mlp.down}.weight", as
    dcp_workload.py names them), each of shape [ranks, item_bytes // 4], rank r holding
    row r (one chunk) stored as an item of item_bytes bytes. Sim.metadata is the pickle a
    real 1.13 save writes for that state dict (torch's own Metadata,
    TensorStorageMetadata, TensorProperties, ChunkStorageMetadata, MetadataIndex and
    filesystem._StorageInfo, planner_data None, storage_data in rank order, with the same
    object sharing as a real save so the bytes match it: `dcp_sim.py check` compares
    against a real save). Layouts: "per-item" (FileSystemWriter's default,
    single_file_per_rank=False: one file per item, `__{rank}_{i}.distcp`) and
    "per-rank" (single_file_per_rank=True: `__{rank}_0.distcp`, the rank's items back
    to back). The item bytes are deterministic (item_data()); the real ones would be a
    torch.save zip of the chunk, which is not the point here.
  * save(mountpoints, sim, procs_per_mount, fsync=True): ranks are placed on nodes in
    contiguous blocks (ranks 0..k-1 on mountpoints[0], k = ceil(ranks / nodes)), each
    node's ranks split in contiguous blocks over procs_per_mount worker processes
    (`dcp_sim.py _worker`, a rank's files one after another, ranks one after another).
    As 1.13 does: the coordinator (rank 0, mountpoints[0]) makes the directory first
    (prepare_global_plan's mkdir), every rank writes each of its files (open "wb", write
    its items, flush, os.fsync when fsync, close), and after every rank is done the
    coordinator writes `.metadata.tmp` (write, os.fsync, close: pickle.dump + fsync
    without a flush, as FileSystemWriter.finish) and renames it to `.metadata`.
  * load(mountpoints, sim, procs_per_mount): every rank first reads `.metadata` whole
    from its node's mount (load_state_dict's read_metadata runs on every rank) and checks
    it, then reads its plan the way FileSystemReader.read_data does: its read items (for
    a same-world load of row-sharded tensors: its own chunk of every tensor, in
    state-dict order) grouped by file in plan order, each file opened once and its items
    read in that order (seek + read of the item; torch.load would read it in several
    smaller pieces through a BufferedReader), every item compared with what was saved.

save() and load() return timings on CLOCK_MONOTONIC (the same clock in every process
of the machine, and the one tools/bench's proxies log): start, end, and per worker
process its start, end, ranks, files and bytes. Workers are ended by their PID on any
error. Stdlib + torch 1.13 (torch only to build the metadata; workers import no torch).

  dcp_sim.py save DIR [DIR...] --ranks N --tensors T --layout per-item|per-rank
             --item-bytes B --procs P [--no-fsync]     (one DIR per node)
  dcp_sim.py load DIR [DIR...] (same options)
  dcp_sim.py check REALDIR --world W --mb MB --layers L [--per-rank]
             (rebuild a real dcp_workload.py save's .metadata with this module's builder
              and compare the bytes)

save/load print one JSON line with the timings; exit non-zero on an error or a mismatch.
"""
import argparse
import hashlib
import json
import math
import os
import select
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = "/usr/bin/python3"
LAYOUTS = ("per-item", "per-rank")
PARTS = ("attn.qkv", "attn.out", "mlp.up", "mlp.down")


class SimError(RuntimeError):
    """A simulated save or load failed (a worker's error, a wrong byte)."""


def tensor_names(tensors):
    return [f"layers.{i // 4}.{PARTS[i % 4]}.weight" for i in range(tensors)]


def file_name(rank, i):
    return f"__{rank}_{i}.distcp"


def item_data(rank, i, n):
    """The n deterministic bytes of rank's i-th item."""
    seed = hashlib.sha256(f"ckptfs-dcp-sim/{rank}/{i}".encode()).digest()
    head = f"rank {rank} item {i} ".encode()
    body = (seed * (n // len(seed) + 2))[: max(0, n - len(head))]
    return (head + body)[:n]


class Sim:
    """A simulated checkpoint: parameters, files, plans, and (if built with torch) the
    .metadata bytes.

    files:     [(relpath, size, saving_rank)] in save order (rank by rank)
    checksums: {relpath: sha256 hex} of each file's content (what a load must read)
    writes:    {rank: [(relpath, [(offset, item index)])]}: the files a rank writes
    plans:     {rank: [(fqn, relpath, offset, length, item index)]}: the rank's load
               plan in 1.13's order (state-dict order)
    metadata:  the .metadata bytes (None when built without torch)
    """

    def __init__(self, ranks, tensors, layout, item_bytes):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}")
        if ranks < 1 or tensors < 1 or item_bytes < 4:
            raise ValueError("ranks and tensors >= 1, item_bytes >= 4")
        self.ranks, self.tensors, self.layout, self.item_bytes = ranks, tensors, layout, item_bytes
        self.names = tensor_names(tensors)
        self.cols = item_bytes // 4
        self.files, self.writes, self.plans = [], {}, {}
        for r in range(ranks):
            if layout == "per-item":
                w = [(file_name(r, i), [(0, i)]) for i in range(tensors)]
            else:
                w = [(file_name(r, 0), [(i * item_bytes, i) for i in range(tensors)])]
            self.writes[r] = w
            for rel, items in w:
                self.files.append((rel, len(items) * item_bytes, r))
            # FileSystemReader.read_data's order: plan order (state-dict order) grouped by
            # file, files in order of their first item.
            self.plans[r] = [(fqn, w[i][0] if layout == "per-item" else w[0][0],
                              0 if layout == "per-item" else i * item_bytes, item_bytes, i)
                             for i, fqn in enumerate(self.names)]
        self.metadata = None
        self._checksums = None

    @property
    def params(self):
        return {"ranks": self.ranks, "tensors": self.tensors, "layout": self.layout,
                "item_bytes": self.item_bytes}

    @property
    def checksums(self):
        if self._checksums is None:
            self._checksums = {}
            for r, w in self.writes.items():
                for rel, items in w:
                    h = hashlib.sha256()
                    for _, i in items:
                        h.update(item_data(r, i, self.item_bytes))
                    self._checksums[rel] = h.hexdigest()
        return self._checksums

    def read_order(self, rank):
        """[(relpath, [(offset, length, item index)])]: the files rank opens, in order,
        and the items it reads from each, in order (FileSystemReader.read_data)."""
        per_file = {}
        for _, rel, off, n, i in self.plans[rank]:
            per_file.setdefault(rel, []).append((off, n, i))
        return list(per_file.items())

    def total_bytes(self):
        return sum(f[1] for f in self.files)


# --------------------------------------------------------------------------- metadata


def _install_shim():
    sys.path.insert(0, HERE)
    import dcp_workload  # noqa: F401  (the torch 1.13 / Python 3.11 import shim)


def _fresh(s):
    """A new str object equal to s: in a real save the fqn and file-name strings of
    storage_data come from other unpickled objects than state_dict_metadata's (each
    rank's gathered write results), so pickle writes them again instead of a memo ref."""
    return s.encode().decode()


def metadata_bytes(tensors, storage):
    """The pickle torch 1.13's FileSystemWriter.finish writes.

    tensors: [(fqn, size, [(offsets, sizes)] per chunk in rank order)] in state-dict order.
    storage: per rank, [(fqn, chunk index, relpath, offset, length)] in that rank's write
             order; items of one file share one relpath object (as gen_file's one name).
    """
    _install_shim()
    import pickle

    import torch
    from torch.distributed._shard.checkpoint.filesystem import _StorageInfo
    from torch.distributed._shard.checkpoint.metadata import (ChunkStorageMetadata, Metadata,
                                                              MetadataIndex, TensorStorageMetadata)
    from torch.distributed._shard.sharded_tensor.metadata import TensorProperties

    sdm = {}
    offsets = {}
    for fqn, size, chunks in tensors:
        # one TensorProperties per tensor (ShardedTensor.metadata()'s), fresh Sizes per chunk
        props = TensorProperties(dtype=torch.float32, layout=torch.strided, requires_grad=False,
                                 memory_format=torch.contiguous_format, pin_memory=False)
        sdm[fqn] = TensorStorageMetadata(properties=props, size=torch.Size(size),
                                         chunks=[ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(s))
                                                 for o, s in chunks])
        offsets[fqn] = [o for o, _ in chunks]
    sd = {}
    for rank_items in storage:
        names = {}
        for fqn, idx, rel, off, length in rank_items:
            rel_obj = names.setdefault(rel, _fresh(rel))
            sd[MetadataIndex(_fresh(fqn), offset=list(offsets[fqn][idx]), index=idx)] = \
                _StorageInfo(rel_obj, off, length)
    md = Metadata(state_dict_metadata=sdm, planner_data=None, storage_data=sd)
    return pickle.dumps(md)


def build(ranks, tensors, layout, item_bytes, with_metadata=True):
    """The Sim of a torch 1.13 DCP save of `tensors` row-sharded tensors by `ranks` ranks."""
    sim = Sim(ranks, tensors, layout, item_bytes)
    if with_metadata:
        specs = [(fqn, [ranks, sim.cols], [([r, 0], [1, sim.cols]) for r in range(ranks)])
                 for fqn in sim.names]
        storage = [[(fqn, r, rel, off, n) for fqn, rel, off, n, _ in sim.plans[r]] for r in range(ranks)]
        sim.metadata = metadata_bytes(specs, storage)
    return sim


def check_real(realdir, world, mb, layers, per_rank):
    """Rebuild the .metadata of a real `dcp_workload.py save REALDIR --world W --mb MB
    --layers L [--per-rank]` with metadata_bytes() (item lengths from the real one: a
    torch.save zip's size is not ours to predict) and compare. (equal, real, ours)."""
    _install_shim()
    import pickle

    import dcp_workload
    with open(os.path.join(realdir, ".metadata"), "rb") as f:
        real = f.read()
    md = pickle.loads(real)
    lengths = {(k.fqn, k.index): v.length for k, v in md.storage_data.items()}
    names = dcp_workload.layout(mb, layers)
    specs = []
    for fqn, rows, cols in names:
        per = -(-rows // world)  # ChunkShardingSpec: ceil(rows / world) rows per rank
        chunks = []
        for r in range(world):
            o = min(r * per, rows)
            chunks.append(([o, 0], [max(0, min(per, rows - o)), cols]))
        specs.append((fqn, [rows, cols], chunks))
    storage = []
    for r in range(world):
        items, off = [], 0
        for i, (fqn, _, _) in enumerate(names):
            n = lengths[(fqn, r)]
            if per_rank:
                items.append((fqn, r, file_name(r, 0), off, n))
                off += n
            else:
                items.append((fqn, r, file_name(r, i), 0, n))
        storage.append(items)
    ours = metadata_bytes(specs, storage)
    return ours == real, real, ours


# --------------------------------------------------------------------------- placement


def placement(ranks, nodes, procs_per_mount):
    """[(node, [ranks])] for every worker process: contiguous blocks of ranks per node
    (k = ceil(ranks / nodes)), each node's block split in contiguous blocks per process."""
    k = math.ceil(ranks / nodes)
    out = []
    for n in range(nodes):
        mine = list(range(n * k, min(ranks, (n + 1) * k)))
        if not mine:
            continue
        p = min(procs_per_mount, len(mine))
        q = math.ceil(len(mine) / p)
        for j in range(p):
            block = mine[j * q:(j + 1) * q]
            if block:
                out.append((n, block))
    return out


def node_of(rank, ranks, nodes):
    return rank // math.ceil(ranks / nodes)


# --------------------------------------------------------------------------- workers


def _worker_save(spec, sim):
    d, fsync, nb = spec["dir"], spec["fsync"], sim.item_bytes
    files = nbytes = 0
    for r in spec["ranks"]:
        for rel, items in sim.writes[r]:
            with open(os.path.join(d, rel), "wb") as f:
                for _, i in items:
                    f.write(item_data(r, i, nb))
                f.flush()
                if fsync:
                    os.fsync(f.fileno())
            files += 1
            nbytes += len(items) * nb
    return {"files": files, "bytes": nbytes}


def _worker_load(spec, sim):
    d, nb = spec["dir"], sim.item_bytes
    files = nbytes = 0
    meta_t = 0.0
    for r in spec["ranks"]:
        t0 = time.monotonic()
        with open(os.path.join(d, ".metadata"), "rb") as f:
            md = f.read()
        meta_t += time.monotonic() - t0
        if len(md) != spec["metadata_size"] or hashlib.sha256(md).hexdigest() != spec["metadata_sha256"]:
            raise SimError(f"rank {r}: .metadata differs from the saved one ({len(md)} bytes)")
        for rel, items in sim.read_order(r):
            with open(os.path.join(d, rel), "rb", buffering=0) as f:
                for off, n, i in items:
                    f.seek(off)
                    got = bytearray()
                    while len(got) < n:
                        b = f.read(n - len(got))
                        if not b:
                            break
                        got += b
                    if bytes(got) != item_data(r, i, nb):
                        raise SimError(f"rank {r}: {rel} item {i} at {off}: read {len(got)} bytes that differ "
                                       f"from the saved ones")
                    nbytes += n
            files += 1
    return {"files": files, "bytes": nbytes, "metadata_read_s": round(meta_t, 6)}


def worker_main():
    """`dcp_sim.py _worker`: the spec as one JSON line on stdin, "ready" on stdout, then
    waits for "go" on stdin, works, and prints its result as one JSON line."""
    spec = json.loads(sys.stdin.readline())
    p = spec["params"]
    sim = Sim(p["ranks"], p["tensors"], p["layout"], p["item_bytes"])
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    t0, w0 = time.monotonic(), time.time()
    try:
        res = (_worker_save if spec["op"] == "save" else _worker_load)(spec, sim)
    except (OSError, SimError) as e:
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        return 1
    res.update({"start": t0, "end": time.monotonic(), "wall_start": w0, "ranks": len(spec["ranks"]),
                "first_rank": spec["ranks"][0], "last_rank": spec["ranks"][-1], "node": spec["node"]})
    print(json.dumps(res), flush=True)
    return 0


def _stop(procs):
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def _run_workers(op, mountpoints, sim, procs_per_mount, extra, subdir, timeout):
    specs = []
    for node, ranks in placement(sim.ranks, len(mountpoints), procs_per_mount):
        s = {"op": op, "dir": os.path.join(mountpoints[node], subdir) if subdir else mountpoints[node],
             "node": node, "ranks": ranks, "params": sim.params}
        s.update(extra)
        specs.append(s)
    procs = []
    try:
        for s in specs:
            procs.append(subprocess.Popen([PY, os.path.abspath(__file__), "_worker"], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, text=True, start_new_session=True))
            procs[-1].stdin.write(json.dumps(s) + "\n")
            procs[-1].stdin.flush()
        deadline = time.monotonic() + 60
        for p in procs:  # every worker has built its plan: start them together
            line = _readline(p, deadline)
            if line.strip() != "ready":
                raise SimError(f"worker pid {p.pid} did not start: {line!r}")
        t0 = time.monotonic()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        deadline = time.monotonic() + timeout
        for p, s in zip(procs, specs):
            line = _readline(p, deadline)
            try:
                r = json.loads(line)
            except ValueError:
                raise SimError(f"worker pid {p.pid} (node {s['node']}, ranks {s['ranks'][0]}-"
                               f"{s['ranks'][-1]}) gave no result: {line!r}") from None
            if "error" in r:
                raise SimError(f"{op} worker (node {s['node']}, ranks {s['ranks'][0]}-{s['ranks'][-1]}): "
                               f"{r['error']}")
            results.append(r)
        for p in procs:
            p.stdin.close()
            p.wait(30)
        return t0, results
    finally:
        _stop(procs)


def _readline(p, deadline):
    """A line of p's stdout, or SimError once the deadline passes."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SimError(f"worker pid {p.pid} timed out")
        r, _, _ = select.select([p.stdout], [], [], min(left, 1.0))
        if r:
            return p.stdout.readline()
        if p.poll() is not None:
            return p.stdout.readline()


def save(mountpoints, sim, procs_per_mount, fsync=True, subdir="", timeout=3600):
    """Save sim into subdir of the mountpoints (one per node) as torch 1.13 does; returns
    {"start", "shards_end", "end", "metadata_s", "procs": [...]} (CLOCK_MONOTONIC)."""
    if sim.metadata is None:
        raise ValueError("save needs a Sim built with its metadata")
    root = os.path.join(mountpoints[0], subdir) if subdir else mountpoints[0]
    t_mkdir = time.monotonic()
    os.makedirs(root, exist_ok=True)  # the coordinator's prepare_global_plan
    t_start, procs = _run_workers("save", mountpoints, sim, procs_per_mount, {"fsync": fsync}, subdir, timeout)
    shards_end = max(p["end"] for p in procs)
    t_meta = time.monotonic()
    tmp = os.path.join(root, ".metadata.tmp")
    with open(tmp, "wb") as f:  # FileSystemWriter.finish: pickle.dump, fsync, close, rename
        f.write(sim.metadata)
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(root, ".metadata"))
    end = time.monotonic()
    return {"op": "save", "mkdir_start": t_mkdir, "start": t_start, "shards_end": shards_end,
            "metadata_start": t_meta, "end": end, "seconds": end - t_start, "metadata_s": end - t_meta,
            "files": sum(p["files"] for p in procs) + 1, "bytes": sum(p["bytes"] for p in procs) + len(sim.metadata),
            "procs": procs}


def load(mountpoints, sim, procs_per_mount, subdir="", timeout=3600):
    """Load sim from subdir of the mountpoints as torch 1.13 does (every rank reads
    .metadata, then its plan), checking every byte; returns the timings."""
    if sim.metadata is None:
        raise ValueError("load needs a Sim built with its metadata (to check .metadata)")
    extra = {"metadata_size": len(sim.metadata), "metadata_sha256": hashlib.sha256(sim.metadata).hexdigest()}
    t_start, procs = _run_workers("load", mountpoints, sim, procs_per_mount, extra, subdir, timeout)
    end = max(p["end"] for p in procs)
    return {"op": "load", "start": t_start, "end": end, "seconds": end - t_start,
            "files_opened": sum(p["files"] for p in procs), "bytes": sum(p["bytes"] for p in procs),
            "metadata_reads": sim.ranks, "procs": procs}


# --------------------------------------------------------------------------- CLI


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "_worker":
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        return worker_main()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("op", choices=["save", "load", "check"])
    ap.add_argument("dirs", nargs="+", metavar="DIR", help="one directory per node (check: the real save)")
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--tensors", type=int, default=12)
    ap.add_argument("--layout", choices=LAYOUTS, default="per-item")
    ap.add_argument("--item-bytes", type=int, default=2048)
    ap.add_argument("--procs", type=int, default=2, help="worker processes per DIR (2)")
    ap.add_argument("--no-fsync", action="store_true", help="save: no os.fsync of the shard files")
    ap.add_argument("--world", type=int, default=2, help="check: the real save's --world")
    ap.add_argument("--mb", type=int, default=1, help="check: the real save's --mb")
    ap.add_argument("--layers", type=int, default=1, help="check: the real save's --layers")
    ap.add_argument("--per-rank", action="store_true", help="check: the real save was --per-rank")
    a = ap.parse_args()
    if a.op == "check":
        same, real, ours = check_real(a.dirs[0], a.world, a.mb, a.layers, a.per_rank)
        print(json.dumps({"op": "check", "equal": same, "real_bytes": len(real), "sim_bytes": len(ours)}))
        return 0 if same else 1
    t0 = time.monotonic()
    sim = build(a.ranks, a.tensors, a.layout, a.item_bytes)
    built = time.monotonic() - t0
    try:
        if a.op == "save":
            res = save(a.dirs, sim, a.procs, fsync=not a.no_fsync)
        else:
            res = load(a.dirs, sim, a.procs)
    except SimError as e:
        print(json.dumps({"op": a.op, "error": str(e)}))
        return 1
    res["build_s"] = round(built, 3)
    res["metadata_bytes"] = len(sim.metadata)
    res["params"] = sim.params
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
