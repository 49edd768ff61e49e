"""Finish-death benchmark: a worker killed as it enters ``finish()``, many times, for every decentralized protocol.

    .venv/bin/python benchmarks/finish_death_bench.py --out runs/finish-deaths               # 50 runs each (~25 min)
    .venv/bin/python benchmarks/finish_death_bench.py --out runs/finish-deaths --runs 5      # quicker
    .venv/bin/python benchmarks/finish_death_bench.py --runs 10 --budget 4 \
        --train-args "--sync-every 8 --compress int8 --local-work auto --outer-optimizer nesterov"

Each run is a `hetrain train` command as a user would start it: 4 workers, digits MLP, 20 ms of
emulated compute, worker 0 three times slower (so the workers are at different iterations when
they stop, and a survivor may still be training when another has finished), a short
``--time-budget``, ``--on-failure continue`` and ``--fail W@finish``: the launcher SIGKILLs worker
W as it enters its protocol's ``finish()`` (the final exchange and average). W cycles over the
ranks 1-3 (rank 0 is the parameter server under ``ps``, whose death ends that job by design).

A run *survived* when the command exits 0, its record names exactly that one death, and the
survivors' averaged model reaches 0.8 test accuracy (a 2 s run); a *hang* is a command still
running 60 s after its budget. Writes OUT/finish_deaths.json (one row per run) and
OUT/finish_deaths.md (a table per protocol, with the first error of each kind).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTOCOLS = ("dpsgd", "hop", "prague", "adpsgd", "ps")
HANG_GRACE_S = 60.0
MIN_ACCURACY = 0.8


def one_run(protocol: str, rank: int, budget_s: float, out: Path, train_args: tuple[str, ...] = ()) -> dict:
    command = [sys.executable, "-m", "hetrain", "train", "--protocol", protocol, "--workers", "4",
               "--compute-ms", "20", "--slowdown", "0:3x", "--time-budget", str(budget_s),
               "--on-failure", "continue", "--fail", f"{rank}@finish", "--timeout", "20",
               "--no-progress", "--out", str(out), *train_args]
    began = time.monotonic()
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=budget_s + HANG_GRACE_S)
        hang = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        hang = True
    metrics_file = out / "metrics.json"
    metrics = json.loads(metrics_file.read_text()) if metrics_file.exists() and proc.returncode == 0 else {}
    deaths = [(d["rank"], d.get("cause")) for d in metrics.get("deaths", [])]
    accuracy = metrics.get("final_accuracy_avg_model")
    survived = (not hang and proc.returncode == 0 and deaths == [(rank, "injected")]
                and (accuracy or 0) >= MIN_ACCURACY)
    lines = output.strip().splitlines()
    return {"protocol": protocol, "rank": rank, "rc": None if hang else proc.returncode, "hang": hang,
            "elapsed_s": round(time.monotonic() - began, 2), "accuracy": accuracy, "deaths": deaths,
            "finish_s_max_worker": metrics.get("finish_s_max_worker"), "survived": survived,
            "error": None if survived else (lines[-1][:300] if lines else "")}


def markdown(rows: list[dict]) -> str:
    lines = ["| protocol | runs | survived | exit != 0 | hangs | slowest run (s) | slowest finish (s) | "
             "lowest accuracy | first error |", "|---|---|---|---|---|---|---|---|---|"]
    for protocol in dict.fromkeys(r["protocol"] for r in rows):
        runs = [r for r in rows if r["protocol"] == protocol]
        finishes = [r["finish_s_max_worker"] for r in runs if r["finish_s_max_worker"] is not None]
        accuracies = [r["accuracy"] for r in runs if r["accuracy"] is not None]
        errors = [r["error"] for r in runs if r["error"]]
        cells = [protocol, len(runs), sum(r["survived"] for r in runs), sum(r["rc"] not in (0, None) for r in runs),
                 sum(r["hang"] for r in runs), f"{max(r['elapsed_s'] for r in runs):.1f}",
                 f"{max(finishes):.2f}" if finishes else "-", f"{min(accuracies):.3f}" if accuracies else "-",
                 errors[0].replace("|", "/") if errors else "-"]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/finish-deaths")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS))
    parser.add_argument("--runs", type=int, default=50, help="runs per protocol")
    parser.add_argument("--budget", type=float, default=2.0, help="each run's --time-budget (s)")
    parser.add_argument("--train-args", default="", help="more `hetrain train` arguments for every run, as one "
                                                         "string (e.g. the communication settings)")
    args = parser.parse_args()
    train_args = tuple(shlex.split(args.train_args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for protocol in args.protocols.split(","):
        for index in range(args.runs):
            row = one_run(protocol, 1 + index % 3, args.budget, out / f"{protocol}-{index}", train_args)
            rows.append(row)
            print(json.dumps(row), flush=True)
            (out / "finish_deaths.json").write_text(json.dumps(rows, indent=2) + "\n")
    table = markdown(rows)
    (out / "finish_deaths.md").write_text(table)
    print(table)
    return 0 if all(r["survived"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
