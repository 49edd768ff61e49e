"""`hetrain train`: one training run of one protocol; writes OUT/metrics.json and a summary."""

from __future__ import annotations

from hetrain.commands.run_options import add_protocol_options, add_workload_options, config_from_args
from hetrain.config import PROTOCOLS, RunConfig
from hetrain.errors import UsageError

HELP = "train with one protocol on local worker processes (or as a rank under torchrun)"
INTERRUPTED_EXIT_CODE = 130  # Ctrl-C: what the run had is written, and the shell learns it was cut short


def add_arguments(parser) -> None:
    parser.add_argument("--protocol", default="hop", help=f"one of {', '.join(PROTOCOLS)}")
    add_workload_options(parser, RunConfig())
    add_protocol_options(parser, RunConfig())
    parser.add_argument("--out", required=True, help="directory for metrics.json and summary.txt")
    parser.add_argument("--no-progress", action="store_true", help="do not show a progress bar")


def run(args) -> int:
    from hetrain.metrics import format_summary
    from hetrain.runtime.run import run_training, run_training_torchrun, under_torchrun

    config = config_from_args(args)
    if under_torchrun():
        metrics = run_training_torchrun(config, args.out)
    else:
        if config.protocol not in PROTOCOLS:  # before any work, for a clear message
            raise UsageError(f"unknown protocol {config.protocol!r}; choose one of {', '.join(PROTOCOLS)}")
        metrics = run_training(config, args.out, progress=not args.no_progress)
    if metrics is not None:
        print(format_summary(metrics))
        print(f"wrote {args.out}/metrics.json")
    if under_torchrun():
        from hetrain.runtime.local_job import exit_without_teardown

        exit_without_teardown(0)
    return INTERRUPTED_EXIT_CODE if metrics is not None and metrics.get("interrupted") else 0
