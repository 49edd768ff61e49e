"""Prague end to end on 8 local workers (digits MLP, 50 ms emulated compute): a measurement, not a test.

    .venv/bin/python benchmarks/prague_bench.py [--budget-even 120] [--budget-straggler 120] [--repeats 3]
                                                [--smart-group-sizes 3] [--out DIR]

(a) no slowdown: samples/s of prague (smart GG), allreduce and adpsgd;
(b) worker 0 five times slower: heterogeneity efficiency and time to 95%
    accuracy for every GG mode (default group size) and for allreduce, plus
    smart at each of ``--smart-group-sizes``.

Time to 95% hinges on single test samples (the digits test split has 360, and
the averaged model hovers at 0.94-0.95 for seconds before it stays above), so
(b) runs every configuration ``--repeats`` times, interleaved, and reports the
median with the range. Runs one job at a time through ``run_training`` and
prints a markdown table (also written to OUT/prague_bench.md);
docs/results/index.md records the figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hetrain.config import RunConfig  # noqa: E402
from hetrain.jobs.run import run_training  # noqa: E402
from hetrain.protocols.prague_options import GG_MODES, PragueOptions  # noqa: E402

DEFAULT_GROUP_SIZE = PragueOptions().group_size


def _config(**fields) -> RunConfig:
    return RunConfig(workload="mlp", num_workers=8, compute_ms=50.0, **fields)


def straggler_runs(modes, smart_group_sizes) -> dict[str, dict]:
    """(b)'s configurations by row name: RunConfig fields, Prague's options under ``options``."""
    runs = {"allreduce": dict(protocol="allreduce")}
    runs.update({f"prague {mode}": dict(protocol="prague", options={"gg": mode}) for mode in modes})
    runs.update({f"prague smart, s={size}": dict(protocol="prague", options={"gg": "smart", "group_size": size})
                 for size in smart_group_sizes if size != DEFAULT_GROUP_SIZE})
    return runs


def _run(out: Path, name: str, **fields) -> dict:
    config = _config(**fields)
    began = time.perf_counter()
    metrics = run_training(config, str(out / name), progress=False)
    print(f"  {name}: {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)
    return metrics


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _spread(values, spec: str, unit: str = "") -> str:
    """Median and range, e.g. ``0.905 (0.890-0.916)``; '-' where a run never got there."""
    if not values or any(v is None for v in values):
        return "-" if all(v is None for v in values) else f"{sum(v is not None for v in values)}/{len(values)} reached"
    text = format(statistics.median(values), spec) + unit
    return text if len(values) == 1 else f"{text} ({min(values):{spec}}-{max(values):{spec}})"


def _fast_wait_ms(metrics: dict) -> float:
    fast = [w for w in metrics["workers"] if w.get("rank", 1) != 0]
    return 1000 * sum(w["wait_s"] for w in fast) / max(1, sum(w["iterations"] for w in fast))


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-even", type=float, default=120.0, help="time budget of the no-slowdown runs (s)")
    parser.add_argument("--budget-straggler", type=float, default=120.0, help="time budget of the straggler runs (s)")
    parser.add_argument("--modes", nargs="+", default=list(GG_MODES), help="GG modes for the straggler runs")
    parser.add_argument("--smart-group-sizes", type=int, nargs="*", default=[3],
                        help="extra straggler runs of the smart GG at these group sizes")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each straggler configuration")
    parser.add_argument("--out", default=None, help="where the runs' metrics.json go (default: a temp dir)")
    args = parser.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="prague_bench_"))

    lines = ["## (a) no slowdown, 8 workers, 50 ms compute, "
             f"{args.budget_even:g} s budget", "",
             "| protocol | samples/s | vs allreduce | efficiency | accuracy |", "| --- | ---: | ---: | ---: | ---: |"]
    even = {}
    for protocol in ("allreduce", "prague", "adpsgd"):
        even[protocol] = _run(out, f"even-{protocol}", protocol=protocol, time_budget_s=args.budget_even)
    base = even["allreduce"]["samples_per_s"]
    for protocol, m in even.items():
        label = "prague (smart)" if protocol == "prague" else protocol
        lines.append(f"| {label} | {m['samples_per_s']:.0f} | {m['samples_per_s'] / base:.2f}x | "
                     f"{m['heterogeneity_efficiency']:.3f} | {m['final_accuracy_avg_model']:.4f} |")

    lines += ["", f"## (b) worker 0 five times slower, {args.budget_straggler:g} s budget, "
              f"median of {args.repeats} runs (range)", "",
              "| run | runs | efficiency | time to 95% (s) | speed-up vs allreduce | final accuracy | "
              "fast worker wait / iteration (ms) |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    runs = straggler_runs(args.modes, args.smart_group_sizes)
    slow: dict[str, list[dict]] = {name: [] for name in runs}
    for repeat in range(args.repeats):
        for name, fields in runs.items():
            tag = name.replace(" ", "-").replace(",", "").replace("=", "")
            slow[name].append(_run(out, f"slow-{tag}-{repeat}", slowdown="0:5x",
                                   time_budget_s=args.budget_straggler, **fields))
    t_ar = _median([m["time_to_target_s"] for m in slow["allreduce"]])
    for name, ms in slow.items():
        t95 = [m["time_to_target_s"] for m in ms]
        speedups = [t_ar / t for t in t95 if t_ar and t]
        waits = [_fast_wait_ms(m) for m in ms]
        label = name if name == "allreduce" or "s=" in name else f"{name} (s={DEFAULT_GROUP_SIZE})"
        lines.append(f"| {label} | {len(ms)} | {_spread([m['heterogeneity_efficiency'] for m in ms], '.3f')} | "
                     f"{_spread(t95, '.2f')} | {_spread(speedups, '.2f', 'x') if len(speedups) == len(ms) else '-'} | "
                     f"{_fmt(_median([m['final_accuracy_avg_model'] for m in ms]), '.4f')} | "
                     f"{_fmt(_median(waits), '.1f')} |")
    table = "\n".join(lines)
    (out / "prague_bench.md").write_text(table + "\n")
    print(table)
    print(f"\nruns in {out}", file=sys.stderr)
    return table


if __name__ == "__main__":
    main()
