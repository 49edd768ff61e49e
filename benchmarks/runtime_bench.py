"""Issue 2's benchmark: allreduce (DDP) vs dpsgd vs hop, side by side in one run.

    .venv/bin/python benchmarks/runtime_bench.py --out runs/bench-runtime

(a) 8 workers, --compute-ms 50, worker 0 five times slower, digits MLP, a time
    budget long enough for allreduce to reach 95%: heterogeneity efficiency,
    time to 95% test accuracy, final accuracies.
(b) the same with no slowdown: samples/s of each protocol relative to allreduce.
Writes OUT/straggler/summary.md, OUT/homogeneous/summary.md and OUT/bench.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hetrain.comparison import run_comparison
from hetrain.config import RunConfig


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/bench-runtime")
    parser.add_argument("--protocols", default="allreduce,dpsgd,hop")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--straggler-budget", type=float, default=120.0, help="seconds per protocol in (a)")
    parser.add_argument("--homogeneous-budget", type=float, default=120.0, help="seconds per protocol in (b)")
    args = parser.parse_args()
    protocols = args.protocols.split(",")
    base = RunConfig(num_workers=args.workers, compute_ms=50.0, target_accuracy=0.95)
    out = Path(args.out)
    sections = []
    for name, slowdown, budget in (("straggler", "0:5x", args.straggler_budget),
                                   ("homogeneous", "none", args.homogeneous_budget)):
        configs = [base.replace(protocol=p, slowdown=slowdown, time_budget_s=budget) for p in protocols]
        print(f"== {name}: {args.workers} workers, slowdown {slowdown}, {budget:.0f} s each", file=sys.stderr)
        summary = run_comparison(configs, str(out / name), progress=True)
        sections.append(f"### {name} (slowdown `{slowdown}`, {budget:.0f} s per protocol)\n\n"
                        + summary["table_markdown"])
    text = "\n\n".join(sections)
    (out / "bench.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
