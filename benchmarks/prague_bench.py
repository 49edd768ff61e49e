"""Prague end to end on 8 local workers (digits MLP, 50 ms emulated compute): a measurement, not a test.

    .venv/bin/python benchmarks/prague_bench.py [--budget-even 10] [--budget-straggler 20] [--out DIR]

(a) no slowdown: samples/s of prague (smart GG), allreduce and adpsgd;
(b) worker 0 five times slower: heterogeneity efficiency and time to 95%
    accuracy for every GG mode and for allreduce.

Runs one job at a time through ``run_training`` and prints a markdown table
(also written to OUT/prague_bench.md); docs/benchmarks-prague.md records the figures.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hetrain.config import RunConfig  # noqa: E402
from hetrain.prague.group_generator import GG_MODES  # noqa: E402
from hetrain.runtime.run import run_training  # noqa: E402


def _run(out: Path, name: str, **fields) -> dict:
    config = RunConfig(workload="mlp", num_workers=8, compute_ms=50.0, **fields)
    began = time.perf_counter()
    metrics = run_training(config, str(out / name), progress=False)
    print(f"  {name}: {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)
    return metrics


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-even", type=float, default=10.0, help="time budget of the no-slowdown runs (s)")
    parser.add_argument("--budget-straggler", type=float, default=20.0, help="time budget of the straggler runs (s)")
    parser.add_argument("--modes", nargs="+", default=list(GG_MODES), help="GG modes for the straggler runs")
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

    lines += ["", f"## (b) worker 0 five times slower, {args.budget_straggler:g} s budget", "",
              "| run | efficiency | time to 95% (s) | speed-up vs allreduce | final accuracy | "
              "fast worker wait / iteration (ms) |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    slow = {"allreduce": _run(out, "slow-allreduce", protocol="allreduce", slowdown="0:5x",
                              time_budget_s=args.budget_straggler)}
    for mode in args.modes:
        slow[f"prague {mode}"] = _run(out, f"slow-prague-{mode}", protocol="prague", gg=mode, slowdown="0:5x",
                                      time_budget_s=args.budget_straggler)
    t_ar = slow["allreduce"]["time_to_target_s"]
    for name, m in slow.items():
        fast = [w for w in m["workers"] if w.get("rank", 1) != 0]
        wait_ms = 1000 * sum(w["wait_s"] for w in fast) / max(1, sum(w["iterations"] for w in fast))
        t95 = m["time_to_target_s"]
        speedup = t_ar / t95 if t_ar and t95 else None
        lines.append(f"| {name} | {m['heterogeneity_efficiency']:.3f} | {_fmt(t95, '.2f')} | "
                     f"{_fmt(speedup, '.1f')}{'x' if speedup else ''} | {m['final_accuracy_avg_model']:.4f} | "
                     f"{wait_ms:.1f} |")
    table = "\n".join(lines)
    (out / "prague_bench.md").write_text(table + "\n")
    print(table)
    print(f"\nruns in {out}", file=sys.stderr)
    return table


if __name__ == "__main__":
    main()
