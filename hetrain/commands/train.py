"""`hetrain train`: one training run of one protocol; writes OUT/metrics.json and a summary."""

from __future__ import annotations

from hetrain.commands.run_options import (
    add_protocol_options,
    add_run_options,
    add_runtime_options,
    comm_values,
    config_from_args,
    protocol_values,
    warn_unused,
)
from hetrain.config import RunConfig
from hetrain.errors import UsageError
from hetrain.outputs import check_out_dir
from hetrain.registry import PROTOCOL_NAMES, get_spec
from hetrain.run_checks import check_before_start

HELP = "train with one protocol on local worker processes (or as a rank under torchrun, or on a Ray cluster)"


def add_arguments(parser) -> None:
    parser.add_argument("--protocol", default="hop",
                        help=f"one of {', '.join(PROTOCOL_NAMES)}, or auto: measure the job for --measure-s "
                             "seconds, simulate the candidates on it and train with the best (hetrain advise)")
    add_run_options(parser, RunConfig())
    add_runtime_options(parser, RunConfig())
    add_protocol_options(parser)
    from hetrain.commands.advise import add_advise_options

    add_advise_options(parser)
    parser.add_argument("--out", required=True, help="directory for metrics.json and summary.txt")
    parser.add_argument("--no-progress", action="store_true", help="do not show a progress bar")
    r = parser.add_argument_group("launcher")
    r.add_argument("--launcher", choices=("local", "ray"), default="local",
                   help="local: worker processes on this machine (default); ray: one Ray actor per worker, spread "
                        "over a Ray cluster's nodes (needs --ray-address and pip install 'hetrain[ray]')")
    r.add_argument("--ray-address", default=None, metavar="ADDRESS",
                   help="the Ray cluster to join (HOST:PORT of its head, or auto)")
    r.add_argument("--ray-worker-resources", default=None, metavar="NAME=AMOUNT,...",
                   help="what each worker's actor reserves, e.g. CPU=1,GPU=1 or CPU=2,A100=1 (a custom resource "
                        "the nodes declare); default CPU=1")


def run(args) -> int:
    from hetrain.jobs.meter import process_started_at
    from hetrain.jobs.torchrun_env import under_torchrun

    advice = None
    if args.protocol == "auto":
        advice = _choose(args)  # every check first, then the measurement; args now name the chosen protocol
    get_spec(args.protocol)  # an unknown protocol fails here, before any work
    warn_unused(protocol_values(args), [args.protocol], comm_values(args))
    config = check_before_start(config_from_args(args))  # before anything starts: bad input fails in < 1 s
    check_out_dir(args.out)
    if args.launcher == "ray":
        _check_ray_options(args)
    elif args.ray_address is not None or args.ray_worker_resources is not None:
        raise UsageError("--ray-address and --ray-worker-resources go with --launcher ray")
    if not under_torchrun():
        from hetrain.jobs.interrupts import stop_on_sigterm

        stop_on_sigterm()  # a scheduler's stop in start-up leaves as Ctrl-C does; in training it stops the job
    if not under_torchrun() and args.launcher == "local":
        from hetrain.jobs.warm_start import start_early

        start_early()  # the warm server imports torch while this process does (2 cores: in parallel)
    from hetrain.jobs.run import run_training, run_training_torchrun
    from hetrain.metrics import format_summary

    if under_torchrun():
        if args.launcher == "ray":
            raise UsageError("--launcher ray starts its own workers; run it outside torchrun")
        metrics = run_training_torchrun(config, args.out, progress=not args.no_progress)
    elif args.launcher == "ray":
        metrics = _run_on_ray(config, args, process_started_at())
    else:
        metrics = run_training(config, args.out, progress=not args.no_progress, launched_at=process_started_at())
    if metrics is not None and advice is not None:
        metrics = _record_choice(args.out, metrics, advice)
    if metrics is not None:
        print(format_summary(metrics))
        print(f"wrote {args.out}/metrics.json")
    if under_torchrun():
        from hetrain.jobs.worker_process import exit_without_teardown

        exit_without_teardown(0)
    return interrupted_exit_code([metrics] if metrics is not None else [])


def _choose(args) -> dict:
    """``--protocol auto``: check the run options, measure, simulate, rank (hetrain advise); set ``args`` to
    the first candidate's protocol, options and communication settings, say which and why; the advice."""
    from hetrain.advisor.advice import advise
    from hetrain.commands.advise import checked_config
    from hetrain.jobs.torchrun_env import under_torchrun

    if args.launcher != "local" or args.checkpoint_dir or under_torchrun():
        raise UsageError("--protocol auto measures on local workers it starts, without checkpoints; choose a protocol "
                         "with hetrain advise first, then run it")
    if protocol_values(args):
        raise UsageError(f"--protocol auto chooses the protocol options itself; drop "
                         f"--{next(iter(protocol_values(args))).replace('_', '-')} or name a protocol")
    config = checked_config(args)
    check_out_dir(args.out)
    advice = advise(config, measure_s=args.measure_s)
    best = advice["recommended"]
    args.protocol = best["protocol"]
    for name, value in {**best["options"], **best["comm"]}.items():
        setattr(args, name, value)
    print(f"auto: {best['name']} (why: {advice['why']})")
    return advice


def _record_choice(out: str, metrics: dict, advice: dict) -> dict:
    """Keep the choice and the measured profile in OUT/metrics.json (``advice``)."""
    from pathlib import Path

    from hetrain.outputs import write_json_atomic

    metrics = {**metrics, "advice": advice}
    write_json_atomic(Path(out) / "metrics.json", metrics)
    return metrics


def interrupted_exit_code(records: list[dict]) -> int:
    """0, or 128 + the stopping signal's number (130 Ctrl-C, 143 SIGTERM) if one stopped a run, or came while
    its record was written: what the runs had is written, and the shell learns they were cut short."""
    from hetrain.jobs.interrupts import (  # hetrain.jobs imports torch: not for --help
        exit_code_for,
        stop_received,
    )

    stopped = [r.get("interrupted_by") or "SIGINT" for r in records if r.get("interrupted")]
    signal_name = stopped[0] if stopped else stop_received()  # or one that came as the record was written
    return exit_code_for(signal_name) if signal_name else 0


def _check_ray_options(args) -> None:
    """Ray is installed, an address is given and the resources parse; UsageError otherwise (exit 2)."""
    from hetrain.ray.connection import require_ray
    from hetrain.ray.resources import parse_resources

    parse_resources(args.ray_worker_resources)
    if not args.ray_address:
        raise UsageError("--launcher ray needs --ray-address (HOST:PORT of the cluster's head, or auto)")
    require_ray()


def _run_on_ray(config, args, launched_at: float):
    from hetrain.ray.resources import parse_resources
    from hetrain.ray.training import run_training_ray

    return run_training_ray(config, args.out, args.ray_address, parse_resources(args.ray_worker_resources),
                            progress=not args.no_progress, launched_at=launched_at)
