"""`hetrain train`: one training run of one protocol; writes OUT/metrics.json and a summary."""

from __future__ import annotations

from hetrain.commands.run_options import (
    add_protocol_options,
    add_run_options,
    add_runtime_options,
    config_from_args,
    protocol_values,
    warn_unused,
)
from hetrain.config import RunConfig
from hetrain.registry import PROTOCOL_NAMES, get_spec

HELP = "train with one protocol on local worker processes (or as a rank under torchrun)"
INTERRUPTED_EXIT_CODE = 130  # Ctrl-C: what the run had is written, and the shell learns it was cut short


def add_arguments(parser) -> None:
    parser.add_argument("--protocol", default="hop", help=f"one of {', '.join(PROTOCOL_NAMES)}")
    add_run_options(parser, RunConfig())
    add_runtime_options(parser, RunConfig())
    add_protocol_options(parser)
    parser.add_argument("--out", required=True, help="directory for metrics.json and summary.txt")
    parser.add_argument("--no-progress", action="store_true", help="do not show a progress bar")


def run(args) -> int:
    from hetrain.jobs.meter import process_started_at
    from hetrain.jobs.torchrun_env import under_torchrun

    get_spec(args.protocol)  # an unknown protocol fails here, before any work
    warn_unused(protocol_values(args), [args.protocol])
    config = config_from_args(args)
    if not under_torchrun():
        from hetrain.jobs.warm_start import start_early

        start_early()  # the warm server imports torch while this process does (2 cores: in parallel)
    from hetrain.jobs.run import run_training, run_training_torchrun
    from hetrain.metrics import format_summary

    if under_torchrun():
        metrics = run_training_torchrun(config, args.out)
    else:
        metrics = run_training(config, args.out, progress=not args.no_progress, launched_at=process_started_at())
    if metrics is not None:
        print(format_summary(metrics))
        print(f"wrote {args.out}/metrics.json")
    if under_torchrun():
        from hetrain.jobs.worker_process import exit_without_teardown

        exit_without_teardown(0)
    return INTERRUPTED_EXIT_CODE if metrics is not None and metrics.get("interrupted") else 0
