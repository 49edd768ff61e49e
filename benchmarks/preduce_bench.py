"""P-Reduce latency against dist.all_reduce on a pre-made group of the same members (gloo, CPU).

    .venv/bin/python benchmarks/preduce_bench.py --workers 8 --sizes-mb 1 40 --groups 2 4 8

For each group size g (members 0..g-1) and buffer size, after warm-up (so the
P-Reduce communicator is cached), members alternate timed P-Reduce calls and
timed ``dist.all_reduce`` + divide on a group made beforehand with
``dist.new_group``; rank 0 prints the median of each and their ratio.
A measurement, not a test: figures depend on the machine's load.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from hetrain.prague.preduce import PReduce
from hetrain.runtime.local_job import run_local


def _bench(ctx, group_sizes, sizes_mb, repeats):
    preduce = PReduce.for_context(ctx)
    premade = {g: dist.new_group(list(range(g))) for g in group_sizes}  # every rank calls new_group
    rows = []
    for size_mb in sizes_mb:
        numel = int(size_mb * 2**20 / 4)
        buf = torch.randn(numel)
        for g in group_sizes:
            members = tuple(range(g))
            times = {"preduce": [], "all_reduce": []}
            if ctx.rank in members:
                for i in range(repeats + 2):
                    for name in ("preduce", "all_reduce") if i % 2 else ("all_reduce", "preduce"):
                        start = time.perf_counter()
                        if name == "preduce":
                            preduce(buf, members)
                        else:
                            dist.all_reduce(buf, group=premade[g])
                            buf.div_(g)
                        if i >= 2:
                            times[name].append(time.perf_counter() - start)
            dist.barrier()
            if ctx.rank == 0:
                p, a = statistics.median(times["preduce"]), statistics.median(times["all_reduce"])
                rows.append((g, size_mb, p * 1e3, a * 1e3, p / a))
    return rows, preduce.stats()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--groups", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 40])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    rows, stats = run_local(_bench, args.workers, (args.groups, args.sizes_mb, args.repeats), timeout_s=300)[0]
    print(f"{'group':>5} {'MB':>5} {'P-Reduce ms':>12} {'all_reduce ms':>14} {'ratio':>6}")
    for g, mb, p, a, ratio in rows:
        print(f"{g:>5} {mb:>5g} {p:>12.2f} {a:>14.2f} {ratio:>6.2f}")
    print(f"rank 0 communicator cache: {stats}")


if __name__ == "__main__":
    main()
