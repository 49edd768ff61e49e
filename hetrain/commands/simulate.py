"""``hetrain simulate``: the protocols in simulated time, at scales one machine cannot run."""

from __future__ import annotations

import argparse
import sys

from hetrain.commands.run_options import (
    add_protocol_options,
    add_run_options,
    comm_values,
    config_from_args,
    parse_protocols,
    protocol_values,
    warn_unused,
)
from hetrain.config import RunConfig
from hetrain.errors import UsageError
from hetrain.registry import PROTOCOL_NAMES, get_spec

HELP = "simulate a protocol (discrete events: compute, network, the protocol's own logic) at any scale"
SWEEP_KEYS = ("workers",)  # what --sweep varies


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hetrain.sim.network import DEFAULT_BANDWIDTH_GBPS, DEFAULT_GG_SERVICE_US, DEFAULT_LATENCY_US
    from hetrain.sim.runner import DEFAULT_COMPUTE_MS, MATH_MODES

    parser.add_argument("--protocol", default="hop",
                        help=f"one of {', '.join(PROTOCOL_NAMES)}; with --sweep a comma list or 'all' (default hop)")
    add_run_options(parser, RunConfig())
    add_protocol_options(parser)
    parser.set_defaults(model_params=None)  # None: the digits MLP's size, as train's default workload
    parser.set_defaults(momentum=None)  # the simulated math is plain SGD: a --momentum would be ignored
    parser.set_defaults(data_split=None)  # the simulated math samples the whole set: another split is refused
    for action in parser._actions:
        if action.dest == "data_split":
            action.help = "the simulated math samples the whole training set for every worker: whole (another is refused)"
    s = parser.add_argument_group("simulator")
    s.add_argument("--bandwidth-gbps", type=float, default=DEFAULT_BANDWIDTH_GBPS,
                   help=f"per-worker link bandwidth in gigabits/s (default {DEFAULT_BANDWIDTH_GBPS:g}: loopback gloo)")
    s.add_argument("--latency-us", type=float, default=DEFAULT_LATENCY_US,
                   help=f"per-message latency in microseconds (default {DEFAULT_LATENCY_US:g}: loopback gloo)")
    s.add_argument("--collective-step-us", type=float, default=None,
                   help="one step of a ring all-reduce in microseconds (default: --latency-us); with more "
                        "processes than cores it is larger: benchmarks/sim_bench.py network measures it")
    s.add_argument("--gg-service-us", type=float, default=DEFAULT_GG_SERVICE_US,
                   help=f"a Group Generator's time per request in microseconds (default {DEFAULT_GG_SERVICE_US:g}; "
                        "measured: benchmarks/gg_service_bench.py, docs/guides/simulator.md)")
    s.add_argument("--math", default="none",
                   help=f"{' or '.join(MATH_MODES)}: digits trains a real MLP per simulated worker "
                        "(default none: timing only)")
    s.add_argument("--timelines", action="store_true", help="also write OUT/timelines.json (compute intervals)")
    s.add_argument("--sweep", default=None, metavar="workers=N1,N2,...",
                   help="run every --protocol at each worker count; write sweep.md/.json/.png")
    s.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    s.add_argument("--out", required=True, help="output directory (metrics.json, summary.txt, ...)")
    parser.epilog = f"--compute-ms defaults to {DEFAULT_COMPUTE_MS:g} in the simulator."


def parse_sweep(text: str) -> list[int]:
    """Parse ``workers=8,64,512`` into worker counts; raise UsageError naming the fix."""
    key, sep, values = (text or "").partition("=")
    if not sep or key.strip() not in SWEEP_KEYS:
        raise UsageError(f"--sweep {text!r}: expected workers=N1,N2,... (e.g. workers=8,64,512,4096)")
    try:
        counts = [int(v) for v in values.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"--sweep {text!r}: worker counts must be integers") from None
    if not counts or min(counts) < 1:
        raise UsageError(f"--sweep {text!r}: give one or more positive worker counts")
    return counts


def _config(args, protocol: str, workers: int) -> RunConfig:
    config = config_from_args(args, protocol=protocol, num_workers=workers)
    if config.model_params is None:  # not given: the synthetic workload's default size (the digits MLP's otherwise)
        config = config.replace(model_params=RunConfig.model_params)
    group_size = config.options.get("group_size")
    if args.sweep and group_size is not None and group_size > workers:
        config = config.replace(options={**config.options, "group_size": workers})
    return config


def run(args) -> int:
    from hetrain.outputs import prepare_out_dir
    from hetrain.sim.network import NetworkParams
    from hetrain.sim.report import summary, write_run
    from hetrain.sim.runner import SimOptions, simulate

    if args.momentum not in (None, 0.0):
        raise UsageError(f"the simulator's model math is plain SGD without momentum; drop --momentum "
                         f"{args.momentum:g} (or give 0)")
    args.momentum = 0.0  # what the simulated math does, so the record's config says so
    if args.data_split not in (None, "whole"):
        raise UsageError(f"the simulator's math samples the whole training set for every worker; drop --data-split "
                         f"{args.data_split} (or give whole)")
    args.data_split = "whole"  # likewise
    options = SimOptions(NetworkParams(args.latency_us, args.bandwidth_gbps, gg_service_us=args.gg_service_us,
                                       collective_step_us=args.collective_step_us),
                         args.math, args.timelines,
                         progress=not args.no_progress)
    if args.sweep:
        return _run_sweep(args, options)
    get_spec(args.protocol)
    warn_unused(protocol_values(args), [args.protocol], comm_values(args))
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
    from hetrain.sim.runner import check_run
    from hetrain.sim.sweep import markdown_table, plot_sweep, run_sweep

    counts = parse_sweep(args.sweep)
    protocols = parse_protocols(args.protocol, "--protocol")
    warn_unused(protocol_values(args), protocols, comm_values(args))
    for protocol in protocols:  # every run's settings pass every check before the first one starts
        for n in counts:
            check_run(_config(args, protocol, n), options, args.model_params)
    out = prepare_out_dir(args.out)
    (out / "runs").mkdir(exist_ok=True)

    def save(record):
        run_dir = out / "runs" / f"{record['protocol']}-{record['num_workers']}"
        run_dir.mkdir(exist_ok=True)
        write_run(run_dir, record)
        efficiency = record["heterogeneity_efficiency"]  # None: no ideal (zero-time compute)
        print(f"  {record['protocol']:>9} x{record['num_workers']:<5} efficiency "
              f"{'-' if efficiency is None else format(efficiency, '.3f')}  samples/s {record['samples_per_s']:.0f}  "
              f"({record['sim_runtime_s']:.1f} s)", file=sys.stderr)

    rows = run_sweep(lambda p, n: _config(args, p, n).validate(), protocols, counts, options, args.model_params,
                     on_run=save)
    table = markdown_table(rows)
    write_json_atomic(out / "sweep.json", {"slowdown": args.slowdown, "iterations": args.iterations,
                                           "time_budget_s": args.time_budget_s,
                                           "compute_ms": args.compute_ms, "rows": rows})
    write_text_atomic(out / "sweep.md", table)
    plot_sweep(rows, out / "sweep.png")
    print(table, end="")
    print(f"wrote {out / 'sweep.md'}, {out / 'sweep.json'}, {out / 'sweep.png'}")
    return 0
