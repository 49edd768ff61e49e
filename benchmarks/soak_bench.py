"""Soak benchmark: every protocol for minutes, at a small and a real payload, watching memory and speed.

    .venv/bin/python benchmarks/soak_bench.py --out runs/soak              # 6 protocols x 4,8 workers x 2 models x 10 min
    .venv/bin/python benchmarks/soak_bench.py --out runs/soak --duration 60 --protocols hop --workers 4   # a quick look
    .venv/bin/python benchmarks/soak_bench.py --out runs/soak-ig4 --protocols hop --option max_ig=4      # a protocol option
    .venv/bin/python benchmarks/soak_bench.py --out runs/soak-i8 --protocols hop --option compression=int8  # a comm setting

Models: the digits MLP (``--compute-ms 50``, 20 KB messages) and a synthetic
model of 25M parameters (100 MB per message, real compute). No slowdown. For
each run: the RSS of all workers together after the first minute and at the end
(medians of the 5 s readings over the second and over the last minute: one
reading swings with buffers that live for a step), and the
job's samples/s in the first and last quarter of the run (from the workers'
``throughput_series`` in metrics.json, recomputed by this version's rules, so
``--skip-done`` re-reads older records the same way). Goals (issue "Runtime soundness"): RSS growth after the
first minute <= 5%, last-quarter rate >= 0.95x the first quarter's. Beside the goal's growth, runs of 4
minutes or more report the growth over their second half (from the median of the minute before the
middle): a one-off step, such as Prague's member-set cache filling when a job meets its sets late, reads
in the first and not in the second; a leak reads in both.

Writes OUT/soak.md and OUT/soak.json after every run (a long sweep can be
resumed with ``--skip-done``), and each run's record under OUT/<model>-<workers>/<protocol>/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from hetrain.comm.option_text import parse_option as _option
from hetrain.comm.option_text import split_options
from hetrain.config import RunConfig
from hetrain.errors import UsageError
from hetrain.jobs.run import run_training
from hetrain.metrics import job_series, quarter_rates, rss_median
from hetrain.registry import PROTOCOL_NAMES

MODELS = {
    "mlp": dict(workload="mlp", compute_ms=50.0),
    "synthetic-25m": dict(workload="synthetic", model_params=25_000_000),
}
RSS_GROWTH_GOAL = 0.05
RATE_RATIO_GOAL = 0.95


def job_series_of(metrics: dict) -> list[dict]:
    """The job's series from the workers' own, by this version's rules (records written before
    windows carried their length get it from their ends)."""
    per_worker = []
    for worker in metrics["workers"]:
        series, previous = [], 0.0
        for point in worker.get("throughput_series", []):
            series.append({**point, "window_s": point.get("window_s", round(point["t_s"] - previous, 3))})
            previous = point["t_s"]
        per_worker.append(series)
    return job_series(per_worker)


def row_of(model: str, workers: int, metrics: dict) -> dict:
    series = job_series_of(metrics)
    end = series[-1]["t_s"] if series else 0.0
    # RSS after the first minute and at the end: medians over the second and the last minute
    rss_1min, rss_end = rss_median(series, 60.0, 120.0), rss_median(series, end - 60.0, end)
    first, last = quarter_rates(series)
    growth = (rss_end - rss_1min) / rss_1min if rss_1min and rss_end is not None else None
    # the same from the minute before the run's middle: a one-off step (a cache filling as a job meets its
    # member sets late) reads in ``growth`` but not here; a leak reads in both
    rss_mid = rss_median(series, end / 2 - 60.0, end / 2) if end >= 240.0 else None
    growth_second_half = (rss_end - rss_mid) / rss_mid if rss_mid and rss_end is not None else None
    ratio = last / first if first and last is not None else None
    return {
        "model": model, "workers": workers, "protocol": metrics["protocol"],
        "wall_time_s": metrics["wall_time_s"], "rss_mb_1min": rss_1min, "rss_mb_end": rss_end,
        "rss_growth": growth, "rss_mb_mid": rss_mid, "rss_growth_second_half": growth_second_half,
        "peak_rss_mb_max_worker": metrics.get("peak_rss_mb_max_worker"),
        "samples_per_s_first_quarter": first, "samples_per_s_last_quarter": last, "rate_ratio": ratio,
        "meets_goals": growth is not None and ratio is not None
        and growth <= RSS_GROWTH_GOAL and ratio >= RATE_RATIO_GOAL,
    }


def markdown(rows: list[dict]) -> str:
    def f(value, spec):
        return "-" if value is None else format(value, spec)

    def percent(value):
        return f(100 * value if value is not None else None, '+.1f') + "%"

    lines = ["| model | workers | protocol | RSS 2nd minute (MB) | RSS last minute (MB) | growth | growth, 2nd half "
             "| peak RSS/worker (MB) | samples/s first quarter | last quarter | last/first | goals |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['workers']} | {r['protocol']} | {f(r['rss_mb_1min'], '.0f')} "
                     f"| {f(r['rss_mb_end'], '.0f')} | {percent(r['rss_growth'])} "
                     f"| {percent(r.get('rss_growth_second_half'))} "
                     f"| {f(r['peak_rss_mb_max_worker'], '.0f')} | {f(r['samples_per_s_first_quarter'], '.1f')} "
                     f"| {f(r['samples_per_s_last_quarter'], '.1f')} | {f(r['rate_ratio'], '.3f')} "
                     f"| {'met' if r['meets_goals'] else 'MISSED'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/soak")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds per run (default 600)")
    parser.add_argument("--protocols", default=",".join(PROTOCOL_NAMES))
    parser.add_argument("--workers", default="4,8")
    parser.add_argument("--models", default=",".join(MODELS), help=f"from {', '.join(MODELS)}")
    parser.add_argument("--timeout", type=float, default=300.0, help="per-wait timeout of the runs (seconds)")
    parser.add_argument("--skip-done", action="store_true", help="reuse runs whose metrics.json exists")
    parser.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                        help="a protocol option or a communication setting by its Python name, e.g. max_ig=4 or "
                             "compression=int8 (repeatable)")
    args = parser.parse_args()
    try:
        options, comm = split_options(dict(_option(text) for text in args.option))
    except UsageError as error:
        parser.error(str(error))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for model in args.models.split(","):
        for workers in (int(w) for w in args.workers.split(",")):
            for protocol in args.protocols.split(","):
                run_dir = out / f"{model}-{workers}" / protocol
                if args.skip_done and (run_dir / "metrics.json").exists():
                    metrics = json.loads((run_dir / "metrics.json").read_text())
                else:
                    config = RunConfig(protocol=protocol, num_workers=workers, time_budget_s=args.duration,
                                       timeout_s=args.timeout, options=options, comm=comm,
                                       **MODELS[model])
                    began = time.time()
                    print(f"== {model}, {workers} workers, {protocol}: {args.duration:.0f} s", file=sys.stderr)
                    metrics = run_training(config, str(run_dir), progress=True, label=f"{model}/{workers}/{protocol}")
                    print(f"   done in {time.time() - began:.0f} s", file=sys.stderr)
                rows.append(row_of(model, workers, metrics))
                (out / "soak.json").write_text(json.dumps(rows, indent=2) + "\n")
                (out / "soak.md").write_text(markdown(rows))
    print(markdown(rows), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
