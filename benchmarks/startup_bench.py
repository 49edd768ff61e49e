"""Start-up and ending: whole ``hetrain train`` commands timed from outside, optionally side by side.

    .venv/bin/python benchmarks/startup_bench.py --out runs/startup
    .venv/bin/python benchmarks/startup_bench.py --vs /path/to/main/.venv/bin/hetrain --repeats 3 --out runs/startup
    .venv/bin/python benchmarks/startup_bench.py --cases hop:8:10 hop:1:1:lm --out runs/startup

Each case is ``PROTOCOL:WORKERS:BUDGET_S[:WORKLOAD]`` with 50 ms of emulated compute per
iteration (``--compute-ms``). Every run is a fresh ``hetrain train`` process; its wall time is
measured from before its start to its exit (what a user waits for), and its ``metrics.json``
gives ``startup_s`` and the phases (absent from commits that do not record them). With ``--vs
HETRAIN_B`` each run of this tree's command is followed by the same case with command B (e.g.
today's main in a checkout of its own), so a drift in the machine's speed affects both alike, and
the ratio is taken pair by pair. Writes OUT/startup.json and OUT/startup.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_CASES = ["hop:1:1", "hop:4:1", "hop:8:10", "dpsgd:8:10", "prague:8:10", "adpsgd:8:10", "ps:8:10",
                 "allreduce:8:10", "hop:8:10:lm"]
PHASES = ("startup_s", "startup_launcher_s", "finish_s_max_worker", "teardown_s")


def _default_hetrain() -> str:
    return str(Path(sys.executable).with_name("hetrain"))


def run_once(hetrain: str, case: str, compute_ms: float, out: Path) -> dict:
    protocol, workers, budget, *rest = case.split(":")
    shutil.rmtree(out, ignore_errors=True)
    cmd = [hetrain, "train", "--protocol", protocol, "--workers", workers, "--time-budget", budget,
           "--compute-ms", str(compute_ms), "--out", str(out), "--no-progress"]
    if rest:
        cmd += ["--workload", rest[0]]
    began = time.monotonic()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=900)
    wall_s = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    return {"wall_s": wall_s, "samples_per_s": metrics["samples_per_s"],
            **{key: metrics.get(key) for key in PHASES}}


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _fmt(value, spec=".2f") -> str:
    return "-" if value is None else format(value, spec)


def markdown(rows: list[dict], side_by_side: bool) -> str:
    head = "| case | whole command (s) | startup_s | launcher (s) | finish (s) | teardown (s) |"
    rule = "|---|---|---|---|---|---|"
    if side_by_side:
        head += " B: whole command (s) | B: startup_s | A/B (pairs) |"
        rule += "---|---|---|"
    lines = [head, rule]
    for r in rows:
        a = r["a"]
        line = (f"| {r['case']} | {_fmt(a['wall_s'])} ({_fmt(a['wall_s_min'])}-{_fmt(a['wall_s_max'])}) | "
                f"{_fmt(a['startup_s'])} | {_fmt(a['startup_launcher_s'])} | {_fmt(a['finish_s_max_worker'])} | "
                f"{_fmt(a['teardown_s'])} |")
        if side_by_side:
            b = r["b"]
            ratios = ", ".join(f"{x:.2f}" for x in r["ratios"])
            line += (f" {_fmt(b['wall_s'])} ({_fmt(b['wall_s_min'])}-{_fmt(b['wall_s_max'])}) | "
                     f"{_fmt(b['startup_s'])} | {ratios} |")
        lines.append(line)
    return "\n".join(lines) + "\n"


def summarize(runs: list[dict]) -> dict:
    walls = [r["wall_s"] for r in runs]
    return {"wall_s": _median(walls), "wall_s_min": min(walls), "wall_s_max": max(walls),
            "runs": runs, **{key: _median([r[key] for r in runs]) for key in PHASES}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/startup")
    parser.add_argument("--hetrain", default=_default_hetrain(), help="command A (default: this tree's)")
    parser.add_argument("--vs", default=None, help="command B, run after A case by case (e.g. main's hetrain)")
    parser.add_argument("--cases", nargs="+", default=DEFAULT_CASES, help="PROTOCOL:WORKERS:BUDGET_S[:WORKLOAD]")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compute-ms", type=float, default=50.0)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in args.cases:
        a_runs, b_runs = [], []
        for repeat in range(args.repeats):
            a_runs.append(run_once(args.hetrain, case, args.compute_ms, out / "run-a"))
            if args.vs:
                b_runs.append(run_once(args.vs, case, args.compute_ms, out / "run-b"))
            print(f"{case} #{repeat + 1}: A {a_runs[-1]['wall_s']:.2f} s"
                  + (f", B {b_runs[-1]['wall_s']:.2f} s" if args.vs else ""), file=sys.stderr, flush=True)
        row = {"case": case, "a": summarize(a_runs)}
        if args.vs:
            row["b"] = summarize(b_runs)
            row["ratios"] = [a["wall_s"] / b["wall_s"] for a, b in zip(a_runs, b_runs)]
        rows.append(row)
    record = {"hetrain": args.hetrain, "vs": args.vs, "compute_ms": args.compute_ms, "repeats": args.repeats,
              "cpu_count": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "rows": rows}
    (out / "startup.json").write_text(json.dumps(record, indent=1) + "\n")
    table = markdown(rows, bool(args.vs))
    (out / "startup.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
