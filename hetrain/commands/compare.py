"""`hetrain compare`: run several protocols with identical settings, one after another.

With no arguments it is hetrain's main job: 8 workers on digits, worker 0 five
times slower, 50 ms of emulated compute per iteration, a fixed time budget per
protocol. Writes DIR/summary.json, DIR/summary.md and DIR/over_time.png
(accuracy and throughput against time), plus each run's metrics.json under
DIR/<protocol>/.
"""

from __future__ import annotations

import os

from hetrain.commands.run_options import (
    add_protocol_options,
    add_run_options,
    add_runtime_options,
    comm_values,
    config_from_args,
    parse_protocols,
    protocol_values,
    warn_unused,
)
from hetrain.commands.train import interrupted_exit_code
from hetrain.config import RunConfig
from hetrain.registry import PROTOCOL_NAMES

HELP = ("run several protocols side by side with identical settings (the main job); by default 8 workers, "
        "worker 0 five times slower, 50 ms of emulated compute, 120 s of training per protocol")
DEFAULT_PROTOCOLS = "allreduce,dpsgd,hop,prague"
# 120 s per protocol: a shorter run hid a leak once (docs/results/2026-12-01-soak.md); headline
# figures come from runs of at least two minutes. `--time-budget 20` gives a quick look.
COMPARE_DEFAULTS = RunConfig(num_workers=8, slowdown="0:5x", compute_ms=50.0, time_budget_s=120.0)


def add_arguments(parser) -> None:
    parser.add_argument("--protocols", default=DEFAULT_PROTOCOLS,
                        help=f"comma-separated, from {', '.join(PROTOCOL_NAMES)}, or all (default {DEFAULT_PROTOCOLS})")
    add_run_options(parser, COMPARE_DEFAULTS)
    add_runtime_options(parser, COMPARE_DEFAULTS)
    add_protocol_options(parser)
    parser.add_argument("--out", default="runs/compare", help="output directory (default runs/compare)")
    parser.add_argument("--no-progress", action="store_true", help="do not show progress bars")


def run(args) -> int:
    from hetrain.comparison import run_comparison
    from hetrain.jobs.interrupts import stop_on_sigterm

    protocols = parse_protocols(args.protocols, "--protocols")
    warn_unused(protocol_values(args), protocols, comm_values(args))
    if args.iterations is None and args.time_budget_s is None:
        args.time_budget_s = COMPARE_DEFAULTS.time_budget_s
    configs = [config_from_args(args, protocol=p) for p in protocols]
    if args.checkpoint_dir:  # one checkpoint directory per protocol
        configs = [c.replace(checkpoint_dir=os.path.join(args.checkpoint_dir, c.protocol)) for c in configs]
    stop_on_sigterm()  # a scheduler's stop: during a run it stops that run, and the summary has the runs so far
    summary = run_comparison(configs, args.out, progress=not args.no_progress)
    print(summary["table_console"])
    print(f"wrote {args.out}/summary.json, summary.md (every column), over_time.png")
    return interrupted_exit_code(summary["runs"])
