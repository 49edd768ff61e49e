"""P-Reduce latency against dist.all_reduce on a pre-made group of the same members (gloo, CPU).

    .venv/bin/python benchmarks/preduce_bench.py --workers 8 --sizes-mb 0.02 1 40 --groups 2 4 8

For each group size g (members 0..g-1) and buffer size, members time calls of
P-Reduce (communicator cached after warm-up) and of ``dist.all_reduce`` +
divide on groups made beforehand with ``dist.new_group``, each call after a
barrier of the members so arrival skew is not timed. Rank 0 prints the median
of each kind and their ratio.

Why several communicators of each kind (``--communicators``, default 4): on
loopback TCP, identically built gloo communicators of the same members differ
by up to 3x at 1 MB (0.74-2.2 ms for 2 workers, 2026-11-30), fixed per
connection for its life. One communicator per side compares two draws of
that, not P-Reduce with all_reduce; so each kind gets K communicators (K
P-Reduce namespaces, K new_groups), calls rotate over all of them in
alternating order, and the medians pool each kind's calls; the lowest and
highest per-communicator medians follow in brackets. Three P-Reduce kinds: as
shipped (a direct exchange for buffers up to 512 KiB, see
:mod:`hetrain.protocols.exchange_rule`), ring only (``direct_max_bytes=0``, the
same gloo all-reduce as the baseline) and direct only (the exchange at every
size). Sizes are MiB (2**20 bytes). A measurement, not a test: figures depend on the machine's load.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from hetrain.groups.preduce import PReduce
from hetrain.jobs.local_job import run_local


def _bench(ctx, group_sizes, sizes_mb, repeats, communicators):
    preduces = [PReduce(timeout_s=ctx.timeout_s, namespace=f"bench{k}") for k in range(communicators)]
    rings = [PReduce(timeout_s=ctx.timeout_s, namespace=f"ring{k}", direct_max_bytes=0) for k in range(communicators)]
    directs = [PReduce(timeout_s=ctx.timeout_s, namespace=f"direct{k}", direct_max_bytes=1 << 40) for k in range(communicators)]
    variants = {"preduce": preduces, "ring": rings, "direct": directs}
    premade = {g: [dist.new_group(list(range(g))) for _ in range(communicators)] for g in group_sizes}
    barrier_group = {g: dist.new_group(list(range(g))) for g in group_sizes}
    rows = []
    for size_mb in sizes_mb:
        buf = torch.randn(int(size_mb * 2**20 / 4))
        for g in group_sizes:
            members = tuple(range(g))
            calls = [(kind, k) for kind in (*variants, "all_reduce") for k in range(communicators)]
            times = {call: [] for call in calls}
            if ctx.rank in members:
                for i in range(repeats + 2):
                    for kind, k in calls if i % 2 else calls[::-1]:
                        dist.barrier(group=barrier_group[g])
                        start = time.perf_counter()
                        if kind in variants:
                            variants[kind][k](buf, members)
                        else:
                            dist.all_reduce(buf, group=premade[g][k])
                            buf.div_(g)
                        if i >= 2:
                            times[(kind, k)].append(time.perf_counter() - start)
            dist.barrier()
            if ctx.rank == 0:
                rows.append((g, size_mb, *(_summary(times, kind) for kind in (*variants, "all_reduce"))))
    stats = [p.stats() for group in variants.values() for p in group]
    return rows, {key: sum(s[key] for s in stats) for key in stats[0]}


def _summary(times, kind):
    """Pooled median (ms) of one kind, and the lowest and highest per-communicator median."""
    per_comm = [statistics.median(v) * 1e3 for (name, _), v in times.items() if name == kind]
    pooled = statistics.median([t for (name, _), v in times.items() if name == kind for t in v]) * 1e3
    return pooled, min(per_comm), max(per_comm)


def _cell(summary) -> str:
    pooled, low, high = summary
    return f"{pooled:.2f} ({low:.2f}-{high:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--groups", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[0.02, 1, 40], help="buffer sizes in MiB")
    parser.add_argument("--repeats", type=int, default=15, help="timed calls per communicator")
    parser.add_argument("--communicators", type=int, default=4, help="communicators of each kind")
    args = parser.parse_args()
    job_args = (args.groups, args.sizes_mb, args.repeats, args.communicators)
    rows, stats = run_local(_bench, args.workers, job_args, timeout_s=600)[0]
    print("| group | buffer | P-Reduce ms | ring only ms | direct only ms | all_reduce ms "
          "| ratio | ratio, ring only | ratio, direct only |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for g, mb, p, r, d, a in rows:
        print(f"| {g} | {mb:g} MiB | {_cell(p)} | {_cell(r)} | {_cell(d)} | {_cell(a)} "
              f"| {p[0] / a[0]:.2f} | {r[0] / a[0]:.2f} | {d[0] / a[0]:.2f} |")
    print(f"rank 0 communicator caches (all {3 * args.communicators} P-Reduce namespaces): {stats}")


if __name__ == "__main__":
    main()
