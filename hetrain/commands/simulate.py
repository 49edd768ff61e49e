"""``hetrain simulate``: the protocols in simulated time, at scales one machine cannot run."""

from __future__ import annotations

import argparse
import sys

from hetrain.config import GG_MODES, PROTOCOLS, RunConfig
from hetrain.errors import UsageError

HELP = "simulate a protocol (discrete events: compute, network, the protocol's own logic) at any scale"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hetrain.sim.network import DEFAULT_BANDWIDTH_GBPS, DEFAULT_LATENCY_US
    from hetrain.sim.runner import DEFAULT_COMPUTE_MS, MATH_MODES

    parser.add_argument("--protocol", default="hop",
                        help=f"one of {', '.join(PROTOCOLS)}; with --sweep a comma list or 'all' (default hop)")
    parser.add_argument("--workers", type=int, default=8, help="number of simulated workers (default 8)")
    parser.add_argument("--iterations", type=int, default=None,
                        help="iterations per worker: stop when every worker's counter reaches K")
    parser.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                        help="stop every worker at this simulated time (heterogeneity-efficiency runs)")
    parser.add_argument("--slowdown", default="none",
                        help="none, I:Kx[,J:Lx], every:N:Kx (workers 0,N,2N,... K times slower), "
                             "random:p=P,factor=K or trace:FILE")
    parser.add_argument("--compute-ms", type=float, default=None,
                        help=f"compute time of one iteration at full speed (default {DEFAULT_COMPUTE_MS:g})")
    parser.add_argument("--model-params", type=int, default=None,
                        help="parameters per model message, 4 bytes each (default: the 4,810 of train's digits MLP)")
    parser.add_argument("--bandwidth-gbps", type=float, default=DEFAULT_BANDWIDTH_GBPS,
                        help=f"per-worker link bandwidth in gigabits/s (default {DEFAULT_BANDWIDTH_GBPS:g}: loopback gloo)")
    parser.add_argument("--latency-us", type=float, default=DEFAULT_LATENCY_US,
                        help=f"per-message latency in microseconds (default {DEFAULT_LATENCY_US:g}: loopback gloo)")
    parser.add_argument("--topology", default="ring", help="dpsgd/hop graph: ring, double_ring, torus, hypercube, "
                        "exponential, complete, or an edge-list file (default ring)")
    parser.add_argument("--backup", type=int, default=None,
                        help="hop: backup workers b (default as in train: 1 where every worker has 2+ in-neighbours)")
    parser.add_argument("--staleness", type=int, default=None,
                        help="hop: bounded staleness s; ps: asynchronous with staleness s (default 0: synchronous)")
    parser.add_argument("--max-ig", type=int, default=None, help="hop: tokens per edge (max iteration gap)")
    parser.add_argument("--skip-threshold", type=int, default=None, help="hop: skip when neighbours are this far ahead")
    parser.add_argument("--gg", default="smart", help=f"prague group generator: {', '.join(GG_MODES)} (default smart)")
    parser.add_argument("--group-size", type=int, default=RunConfig.group_size,
                        help=f"prague: P-Reduce group size (default {RunConfig.group_size})")
    parser.add_argument("--workers-per-node", type=int, default=None, help="prague static schedule: workers per node")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per iteration per worker (default 32)")
    parser.add_argument("--lr", type=float, default=0.1, help="learning rate with --math digits (default 0.1)")
    parser.add_argument("--target-accuracy", type=float, default=0.95, help="for time-to-target (default 0.95)")
    parser.add_argument("--math", default="none",
                        help=f"{' or '.join(MATH_MODES)}: digits trains a real MLP per simulated worker "
                             "(default none: timing only)")
    parser.add_argument("--seed", type=int, default=0, help="seed for slowdown draws, groups and math (default 0)")
    parser.add_argument("--timelines", action="store_true", help="also write OUT/timelines.json (compute intervals)")
    parser.add_argument("--sweep", default=None, metavar="workers=N1,N2,...",
                        help="run every --protocol at each worker count; write sweep.md/.json/.png")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument("--out", required=True, help="output directory (metrics.json, summary.txt, ...)")


def _config(args, protocol: str, workers: int) -> RunConfig:
    return RunConfig(
        protocol=protocol, num_workers=workers, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
        slowdown=args.slowdown, compute_ms=args.compute_ms, iterations=args.iterations,
        time_budget_s=args.time_budget,
        target_accuracy=args.target_accuracy, topology=args.topology, backup=args.backup,
        staleness=args.staleness, max_ig=args.max_ig, skip_threshold=args.skip_threshold, gg=args.gg,
        group_size=min(args.group_size, workers) if args.sweep or protocol != "prague" else args.group_size,
        workers_per_node=args.workers_per_node,
    )


def run(args) -> int:
    from hetrain.outputs import prepare_out_dir
    from hetrain.sim.network import NetworkParams
    from hetrain.sim.report import summary, write_run
    from hetrain.sim.runner import SimOptions, simulate

    options = SimOptions(NetworkParams(args.latency_us, args.bandwidth_gbps), args.math, args.timelines,
                         progress=not args.no_progress)
    if args.sweep:
        return _run_sweep(args, options)
    if args.protocol not in PROTOCOLS:
        raise UsageError(f"unknown protocol {args.protocol!r}; choose one of {', '.join(PROTOCOLS)}")
    config = _config(args, args.protocol, args.workers).validate()
    record = simulate(config, options, args.model_params)
    out = prepare_out_dir(args.out)
    write_run(out, record)
    print(summary(record))
    print(f"wrote {out / 'metrics.json'}")
    return 0


def _run_sweep(args, options) -> int:
    from hetrain.outputs import prepare_out_dir, write_json_atomic, write_text_atomic
    from hetrain.sim.report import write_run
    from hetrain.sim.sweep import markdown_table, parse_protocols, parse_sweep, plot_sweep, run_sweep

    counts = parse_sweep(args.sweep)
    protocols = parse_protocols(args.protocol)
    base = _config(args, protocols[0], counts[0]).validate()
    out = prepare_out_dir(args.out)
    (out / "runs").mkdir(exist_ok=True)

    def save(record):
        run_dir = out / "runs" / f"{record['protocol']}-{record['num_workers']}"
        run_dir.mkdir(exist_ok=True)
        write_run(run_dir, record)
        print(f"  {record['protocol']:>9} x{record['num_workers']:<5} efficiency "
              f"{record['heterogeneity_efficiency']:.3f}  samples/s {record['samples_per_s']:.0f}  "
              f"({record['sim_runtime_s']:.1f} s)", file=sys.stderr)

    rows = run_sweep(base, protocols, counts, options, args.model_params, on_run=save)
    table = markdown_table(rows)
    write_json_atomic(out / "sweep.json", {"slowdown": args.slowdown, "iterations": args.iterations,
                                           "time_budget_s": args.time_budget,
                                           "compute_ms": base.compute_ms, "rows": rows})
    write_text_atomic(out / "sweep.md", table)
    plot_sweep(rows, out / "sweep.png")
    print(table, end="")
    print(f"wrote {out / 'sweep.md'}, {out / 'sweep.json'}, {out / 'sweep.png'}")
    return 0
