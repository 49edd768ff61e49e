"""``hetrain advise``: measure the job briefly, simulate candidate configurations on the measurement, rank them."""

from __future__ import annotations

from pathlib import Path

from hetrain.commands.run_options import add_run_options, add_runtime_options, config_from_args
from hetrain.config import RunConfig
from hetrain.errors import UsageError

HELP = ("measure the job for a few seconds, simulate each protocol and its main options on what was "
        "measured, and print the ranking and the hetrain train command to run")


def add_arguments(parser) -> None:
    add_run_options(parser, RunConfig())
    add_runtime_options(parser, RunConfig())
    add_advise_options(parser)
    parser.add_argument("--json", default=None, metavar="OUT",
                        help="write the measured profile, every candidate's prediction and the recommended "
                             "command to this JSON file")


def add_advise_options(parser) -> None:
    """The measuring run's length (advise, and train --protocol auto)."""
    from hetrain.advisor.advice import DEFAULT_MEASURE_S

    parser.add_argument("--measure-s", type=float, default=DEFAULT_MEASURE_S, dest="measure_s",
                        help=f"seconds of training the measurement runs (all-reduce; default {DEFAULT_MEASURE_S:g}); "
                             "with --protocol auto or hetrain advise")


def checked_config(args) -> RunConfig:
    """The job's config from the run options, every check passed (UsageError otherwise), nothing started."""
    from hetrain.advisor.advice import MEASURE_PROTOCOL, measuring_config
    from hetrain.run_checks import check_before_start

    config = check_before_start(config_from_args(args, protocol=MEASURE_PROTOCOL))
    measuring_config(config, args.measure_s)  # a bad --measure-s fails here
    if config.workload in ("cnn", "lm"):
        raise UsageError(f"advise simulates the mlp's or the synthetic model's messages, not --workload "
                         f"{config.workload}'s; use --workload synthetic --model-params P for its size")
    return config


def run(args) -> int:
    from hetrain.outputs import write_json_atomic

    config = checked_config(args)
    if args.json:
        check_json_path(args.json)
    from hetrain.advisor.advice import advise

    advice = advise(config, measure_s=args.measure_s)
    print(format_table(advice))
    print(f"why: {advice['why']}")
    print(f"run: {advice['recommended']['command']}")
    if args.json:
        write_json_atomic(args.json, advice)
        print(f"wrote {args.json}")
    return 0


def check_json_path(path: str) -> None:
    """``--json OUT`` names a file whose directory exists (UsageError otherwise): checked before the run."""
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"--json {path}: is a directory; give a file path such as {target / 'advice.json'}")
    if not target.parent.is_dir():
        raise UsageError(f"--json {path}: directory {target.parent} does not exist; create it first")


def format_table(advice: dict) -> str:
    """The ranked candidates, one line each, after a line on what was measured."""
    p = advice["profile"]
    lines = [f"measured {p['num_workers']} workers for {p['measured_s']:.1f} s: compute ms/iteration "
             f"{min(p['compute_ms']):.1f}-{max(p['compute_ms']):.1f}, model {p['model_params']} parameters, "
             f"all-reduce {p['allreduce_ms']:.2f} ms",
             f"{'rank':>4}  {'candidate':<44} {'samples/s':>10} {'efficiency':>10} {'to target':>9} "
             f"{'bytes/sample':>12}"]
    for i, c in enumerate(advice["candidates"], 1):
        eff = "-" if c["heterogeneity_efficiency"] is None else f"{c['heterogeneity_efficiency']:.3f}"
        ttt = "-" if c["time_to_target_s"] is None else f"{c['time_to_target_s']:.1f}s"
        bps = "-" if c["bytes_per_sample"] is None else f"{c['bytes_per_sample']:.0f}"
        notes = [c["note"]] if c["note"] else []
        if not c.get("accuracy_predicted"):
            notes.append("accuracy not predicted")
        elif c["time_to_target_s"] is None:
            notes.append(f"target not reached in {c.get('horizon_s', 0):g} simulated s")
        lines.append(f"{i:>4}  {c['name']:<44} {c['samples_per_s']:>10.0f} {eff:>10} {ttt:>9} {bps:>12}"
                     + (f"  ({'; '.join(notes)})" if notes else ""))
    return "\n".join(lines)
