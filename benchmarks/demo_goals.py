"""Issue 37's goals on the demo, run by run: `hetrain compare` N times, then each goal met or missed.

    .venv/bin/python benchmarks/demo_goals.py --out runs/goals --runs 3           # 3 x (allreduce, hop, prague), ~20 min
    .venv/bin/python benchmarks/demo_goals.py --out runs/goals-exp --runs 3 \
        --compare-args "--late-updates progress --topology exponential"           # a setting under test
    .venv/bin/python benchmarks/demo_goals.py --read runs/demo runs/demo2         # verdicts for comparisons already run

Each run is `hetrain compare --protocols allreduce,hop,prague --no-progress` at the demo's settings (8
workers, worker 0 5x slower, 50 ms of emulated compute, 120 s per protocol) plus ``--compare-args``,
into OUT/run-K. The goals (issue 37, read off each run's summary.json):

- hop's averaged model: accuracy >= allreduce's - 0.005; test loss <= 1.15x allreduce's; no drift (its loss
  at the end <= 1.05x its loss at a quarter of the run, 30 s of 120 s); heterogeneity efficiency >= 0.93;
- hop's and prague's worst worker (every worker's own model) at 95% >= 3x sooner than DDP's model.

Writes OUT/goals.json (every run's figures and verdicts) and OUT/goals.md (a table, and each goal's tally
over the runs). The verdicts are the runs' own figures against the goals: a goal met in some runs and
missed in others is reported as such, not averaged away.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTOCOLS = ("allreduce", "hop", "prague")


def goals(rows: dict[str, dict]) -> list[tuple[str, float | None, bool]]:
    """(goal, figure, met) for one comparison's summary rows, by protocol."""
    base, hop = rows.get("allreduce"), rows.get("hop")
    if base is None or hop is None:
        raise ValueError("a comparison needs allreduce and hop rows (run with --protocols allreduce,hop[,prague])")
    loss_ratio = hop["final_loss_avg_model"] / base["final_loss_avg_model"]
    found = [
        ("hop accuracy >= allreduce's - 0.005", hop["final_accuracy_avg_model"],
         hop["final_accuracy_avg_model"] >= base["final_accuracy_avg_model"] - 0.005),
        ("hop loss <= 1.15x allreduce's", loss_ratio, loss_ratio <= 1.15),
        ("hop loss at the end <= 1.05x at 1/4", hop.get("loss_drift"),
         hop.get("loss_drift") is not None and hop["loss_drift"] <= 1.05),
        ("hop efficiency >= 0.93", hop["heterogeneity_efficiency"], hop["heterogeneity_efficiency"] >= 0.93),
    ]
    for name in ("hop", "prague"):
        if name in rows:
            sooner = rows[name].get("speedup_time_to_target_worst_worker")
            found.append((f"{name} worst worker >= 3x sooner than DDP", sooner, sooner is not None and sooner >= 3.0))
    return found


def read_comparison(directory: Path) -> dict[str, dict]:
    summary = json.loads((directory / "summary.json").read_text())
    return {row["protocol"]: row for row in summary["runs"]}


def report(directories: list[Path]) -> tuple[list[dict], str]:
    """Every run's verdicts, and the markdown: one row per run, then each goal's tally over the runs that
    have it (a comparison without prague has no prague goal)."""
    runs = [{"run": str(d), "goals": {g: {"figure": f, "met": m} for g, f, m in goals(read_comparison(d))}}
            for d in directories]
    names = list(dict.fromkeys(name for run in runs for name in run["goals"]))
    lines = ["| run | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for run in runs:
        cells = [_cell(run["goals"].get(name)) for name in names]
        lines.append(f"| {run['run']} | " + " | ".join(cells) + " |")
    lines.append("")
    for name in names:
        verdicts = [run["goals"][name]["met"] for run in runs if name in run["goals"]]
        lines.append(f"- {name}: met in {sum(verdicts)} of {len(verdicts)} runs")
    return runs, "\n".join(lines) + "\n"


def _cell(verdict: dict | None) -> str:
    if verdict is None:
        return "-"
    return f"{_fmt(verdict['figure'])} {'met' if verdict['met'] else '**MISSED**'}"


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/goals", help="where the runs and goals.json/.md go")
    parser.add_argument("--runs", type=int, default=3, help="comparisons to run (default 3: the issue's 'repeated twice')")
    parser.add_argument("--compare-args", default="", help="more arguments for each `hetrain compare`")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS))
    parser.add_argument("--read", nargs="+", type=Path, help="only read these comparison directories (nothing run)")
    args = parser.parse_args(argv)
    if args.read:
        directories = args.read
        out = None
    else:
        out = Path(args.out)
        directories = []
        for k in range(1, args.runs + 1):
            directory = out / f"run-{k}"
            command = [sys.executable, "-m", "hetrain", "compare", "--protocols", args.protocols, "--no-progress",
                       "--out", str(directory), *shlex.split(args.compare_args)]
            print(f"[{k}/{args.runs}] {shlex.join(command)}", flush=True)
            subprocess.run(command, cwd=ROOT, check=True)
            directories.append(directory)
    try:
        runs, markdown = report(directories)
    except (OSError, ValueError, KeyError) as exc:
        print(f"demo_goals: cannot read the comparisons: {exc}; give directories written by `hetrain compare`",
              file=sys.stderr)
        return 2
    print(markdown)
    if out is not None:
        (out / "goals.json").write_text(json.dumps(runs, indent=1) + "\n")
        (out / "goals.md").write_text(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
