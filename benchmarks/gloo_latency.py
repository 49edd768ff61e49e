"""Latencies of loopback gloo with N processes on this machine, for the simulator's network model.

``measure(n, nbytes)`` starts ``n`` gloo processes (a file store in a temporary
directory, one torch thread each) and returns:

- ``one_way_us``: half the median round trip of an 8-byte send/recv, every pair
  of processes (0-1, 2-3, ...) ping-ponging at once;
- ``allreduce_ms``: the median time of an all-reduce of ``nbytes`` (float32) by
  all ``n``, from the moment its last member enters (the others already wait in
  it, as DDP's workers wait for a straggler; the simulator charges the ring from
  the last arrival too), timed by that last member;
- ``step_us``: that all-reduce as the simulator's ring (``2 (n - 1)`` steps of
  ``nbytes / n``) would have to cost per step, bandwidth ``bandwidth_bytes_per_s``
  taken off: ``hetrain simulate --collective-step-us``.

Used by ``benchmarks/sim_bench.py network`` (a table) and ``fidelity``; run alone it prints
one JSON line per process count::

    python benchmarks/gloo_latency.py --workers 2 4 8 16 --bytes 19240
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hetrain.sim.math_model import DIGITS_PARAMS  # noqa: E402

ROUNDS = 200
LAST_ARRIVAL_S = 0.02  # how long rank 0 lets the others wait in each timed all-reduce


def _worker(rank: int, world: int, store: str, nbytes: int, queue) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    ping, peer = torch.zeros(2), rank ^ 1
    trips = []
    dist.barrier()
    if peer < world:
        for _ in range(ROUNDS):
            start = time.perf_counter()
            if rank % 2 == 0:
                dist.send(ping, peer)
                dist.recv(ping, peer)
            else:
                dist.recv(ping, peer)
                dist.send(ping, peer)
            trips.append(time.perf_counter() - start)
    grad = torch.zeros(max(1, nbytes // 4))
    for _ in range(10):
        dist.all_reduce(grad)
    reduces = []
    for _ in range(ROUNDS // 2):
        dist.barrier()
        if rank == 0:
            time.sleep(LAST_ARRIVAL_S)  # the others enter first and wait
        start = time.perf_counter()
        dist.all_reduce(grad)
        reduces.append(time.perf_counter() - start)
    if rank == 0:
        queue.put((statistics.median(trips) / 2 if trips else None, statistics.median(reduces)))
    dist.destroy_process_group()


def measure(n: int, nbytes: int, bandwidth_bytes_per_s: float, timeout_s: float = 120.0) -> dict:
    """Latencies of ``n`` local gloo processes (see the module docstring)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = mp.start_processes(_worker, args=(n, os.path.join(tmp, "store"), nbytes, queue), nprocs=n,
                                   join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not procs.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{n} gloo processes did not finish the latency measurement in {timeout_s:g} s")
        finally:
            for p in procs.processes:
                if p.is_alive():
                    p.kill()
    one_way, reduce_s = queue.get(timeout=10.0)  # every process has exited: rank 0's result is queued
    steps = 2 * (n - 1)
    step = reduce_s / steps - nbytes / (n * bandwidth_bytes_per_s) if n > 1 else 0.0
    return {"processes": n, "one_way_us": None if one_way is None else one_way * 1e6,
            "allreduce_ms": reduce_s * 1e3, "step_us": max(step, 0.0) * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", nargs="+", type=int, default=[2, 4, 8, 16], help="process counts")
    parser.add_argument("--bytes", type=int, default=DIGITS_PARAMS * 4,
                        help="all-reduce size in bytes (default: the digits MLP's float32 gradient)")
    parser.add_argument("--bandwidth-gbps", type=float, default=24.0, help="taken off the ring step (default 24)")
    args = parser.parse_args()
    for n in args.workers:
        print(json.dumps(measure(n, args.bytes, args.bandwidth_gbps * 1e9 / 8)), flush=True)


if __name__ == "__main__":
    main()
