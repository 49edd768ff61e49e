"""Throughput of Hop and D-PSGD with the control/data plane split against a baseline checkout, side by side.

    git worktree add /tmp/hetrain-base <commit before the split>
    .venv/bin/python benchmarks/data_plane_bench.py --baseline /tmp/hetrain-base --out runs/data-plane

Each configuration runs as ``hetrain train`` from this checkout (A) and from the baseline (B) in
turn, A B A B ..., each a fresh job; the ratio of samples/s (metrics.json) is taken pair by pair,
so drift in the machine's speed cancels. Configurations: the demo's (8 workers, the digits MLP with
50 ms of emulated compute, worker 0 5x slower) and the soak's real payload (4 workers, a synthetic
model of 25M parameters: 100 MB messages, real compute). ``HETRAIN_DATA_PLANE`` from the environment
applies to A (e.g. ``split`` to time NCCL's layout over gloo). Writes OUT/data_plane.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CONFIGS = {
    "demo": ["--workers", "8", "--workload", "mlp", "--compute-ms", "50", "--slowdown", "0:5x"],
    "soak-25m": ["--workers", "4", "--workload", "synthetic", "--model-params", "25000000"],
}


def run_once(tree: Path, protocol: str, config: str, budget_s: float, out: Path, env: dict) -> float:
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "hetrain", "train", "--protocol", protocol, *CONFIGS[config],
               "--time-budget", str(budget_s), "--no-progress", "--out", str(out)]
    # run from the tree: `python -m` puts the current directory before PYTHONPATH, so from a checkout both
    # arms imported that checkout's hetrain (the baseline ran this tree's code)
    subprocess.run(command, check=True, env={**env, "PYTHONPATH": str(tree)}, cwd=tree, stdout=subprocess.DEVNULL,
                   stderr=open(out / "stderr.log", "w"), timeout=budget_s * 4 + 120)
    imported = subprocess.run([sys.executable, "-c", "import hetrain; print(hetrain.__file__)"], cwd=tree,
                              env={**env, "PYTHONPATH": str(tree)}, capture_output=True, text=True).stdout.strip()
    if not Path(imported).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"{tree}: its runs import hetrain from {imported}, not from the tree")
    return float(json.loads((out / "metrics.json").read_text())["samples_per_s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout of the code to compare against")
    parser.add_argument("--out", type=Path, default=Path("runs/data-plane"))
    parser.add_argument("--protocols", default="hop,dpsgd")
    parser.add_argument("--configs", default="demo,soak-25m")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--budget", type=float, default=40.0, help="training seconds per run")
    args = parser.parse_args(argv)
    here = Path(__file__).resolve().parent.parent
    env_a = dict(os.environ)
    env_b = {k: v for k, v in os.environ.items() if k != "HETRAIN_DATA_PLANE"}
    rows = []
    for config in args.configs.split(","):
        for protocol in args.protocols.split(","):
            pairs = []
            for i in range(args.pairs):
                base = args.out / config / protocol / str(i)
                a = run_once(here, protocol, config, args.budget, base / "a", env_a)
                b = run_once(args.baseline.resolve(), protocol, config, args.budget, base / "b", env_b)
                pairs.append((a, b))
                print(f"{config} {protocol} pair {i}: {a:.1f} vs {b:.1f} samples/s ({a / b:.3f})", flush=True)
            ratios = [a / b for a, b in pairs]
            rows.append(dict(config=config, protocol=protocol, pairs=pairs, median_ratio=statistics.median(ratios),
                             min_ratio=min(ratios), max_ratio=max(ratios)))
            write(args.out, rows, args)
    return 0


def write(out: Path, rows: list[dict], args) -> None:
    out.mkdir(parents=True, exist_ok=True)
    record = dict(date=time.strftime("%Y-%m-%d"), budget_s=args.budget,
                  layout=os.environ.get("HETRAIN_DATA_PLANE", "default"), rows=rows)
    (out / "data_plane.json").write_text(json.dumps(record, indent=1))
    lines = ["| config | protocol | samples/s, this checkout (each pair) | baseline | ratio, median (min-max) |",
             "|---|---|---|---|---|"]
    for row in rows:
        a = ", ".join(f"{p[0]:.1f}" for p in row["pairs"])
        b = ", ".join(f"{p[1]:.1f}" for p in row["pairs"])
        lines.append(f"| {row['config']} | {row['protocol']} | {a} | {b} | {row['median_ratio']:.3f} "
                     f"({row['min_ratio']:.3f}-{row['max_ratio']:.3f}) |")
    (out / "data_plane.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
