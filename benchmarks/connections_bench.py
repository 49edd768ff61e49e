"""TCP connections per worker: how they grow with the job's size, for hop (ring) and prague.

    .venv/bin/python benchmarks/connections_bench.py --out runs/connections              # 8,16,32 workers
    .venv/bin/python benchmarks/connections_bench.py --out runs/connections --workers 8 --budget 5

A decentralized worker talks to a few neighbours, but a world-sized gloo group
may connect every pair. For each protocol and job size this runs a short local
job twice: gloo's default (connect every pair of a group when it is created)
and ``TORCH_GLOO_LAZY_INIT=1`` (connect a pair on its first message; hetrain's
default since this measurement). Each
worker counts its established TCP connections (``/proc``; see
``hetrain.jobs.meter.tcp_connections``) while training, just before the
final average over the whole job, and after it. Writes OUT/connections.md and
OUT/connections.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from hetrain.config import RunConfig
from hetrain.jobs.run import run_training

LAZY_ENV = "TORCH_GLOO_LAZY_INIT"


def measure(protocol: str, workers: int, lazy: bool, budget_s: float, out: Path) -> dict:
    os.environ[LAZY_ENV] = "1" if lazy else "0"  # explicit: hetrain's own default is lazy
    config = RunConfig(protocol=protocol, num_workers=workers, time_budget_s=budget_s, compute_ms=50.0,
                       timeout_s=300.0)
    metrics = run_training(config, str(out / f"{protocol}-{workers}-{'lazy' if lazy else 'eager'}"), progress=False)
    training = [w["tcp_connections_training"] for w in metrics["workers"]]
    end = [w["tcp_connections_end"] for w in metrics["workers"]]
    return {"protocol": protocol, "workers": workers, "gloo": "lazy" if lazy else "eager",
            "training_median": statistics.median(training), "training_max": max(training),
            "end_median": statistics.median(end), "end_max": max(end),
            "final_accuracy": metrics["final_accuracy_avg_model"]}


def markdown(rows: list[dict]) -> str:
    lines = ["| protocol | workers | gloo connections | per worker while training (median / max) "
             "| after the final average (median / max) | final accuracy |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['protocol']} | {r['workers']} | {r['gloo']} | {r['training_median']:g} / "
                     f"{r['training_max']} | {r['end_median']:g} / {r['end_max']} | {r['final_accuracy']:.4f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/connections")
    parser.add_argument("--protocols", default="hop,prague")
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--budget", type=float, default=10.0, help="seconds of training per run (default 10)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for workers in args.workers:
        for protocol in args.protocols.split(","):
            for lazy in (False, True):
                rows.append(measure(protocol, workers, lazy, args.budget, out))
                print(f"{protocol} {workers} {'lazy' if lazy else 'eager'}: {rows[-1]}", file=sys.stderr, flush=True)
                (out / "connections.json").write_text(json.dumps(rows, indent=2) + "\n")
                (out / "connections.md").write_text(markdown(rows))
    print(markdown(rows), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
