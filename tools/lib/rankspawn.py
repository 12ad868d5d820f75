"""tools/lib/rankspawn.py - a world of ranks as spawned processes, and what each reports.

The workloads (dcp_workload.py on the host's torch 1.13, dcp2_workload.py in the torch 2.x
chroots) start their gloo ranks here. TorchChroot.inside_copy copies this file next to
every script it copies into a chroot, so `import rankspawn` works there too.
"""

import multiprocessing
import queue
import socket


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago (the ranks' rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(worker, world, *args):
    """Run worker(rank, world, port, *args, results) in `world` spawned processes; each
    rank puts its results on the queue `results`. Returns (what was put, in arrival
    order; the exit code of each rank). The queue is drained while the ranks run: a large
    result would otherwise keep its rank from exiting."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, world, port, *args, results))
             for r in range(world)]
    for p in procs:
        p.start()
    got = []
    while len(got) < world and any(p.is_alive() for p in procs):
        try:
            got.append(results.get(timeout=0.5))
        except queue.Empty:
            pass
        if any(p.exitcode not in (None, 0) for p in procs):
            break  # a rank failed: the others would wait for it in a collective forever
    failed = any(p.exitcode not in (None, 0) for p in procs)
    for p in procs:
        if failed and p.is_alive():
            p.terminate()
            p.join(10)
            if p.is_alive():
                p.kill()
        p.join()
    while len(got) < world:
        try:
            got.append(results.get(timeout=1))
        except queue.Empty:
            break
    return got, [p.exitcode for p in procs]
