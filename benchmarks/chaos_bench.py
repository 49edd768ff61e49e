"""Chaos benchmark: one worker SIGKILLed (or SIGSTOPped) from outside, by pid, at a random moment.

    .venv/bin/python benchmarks/chaos_bench.py --out runs/chaos                       # the issue's sweep (hours)
    .venv/bin/python benchmarks/chaos_bench.py --out runs/chaos --runs 4 --stops 1 --budget 15   # quicker
    .venv/bin/python benchmarks/chaos_bench.py --protocols hop --train-args "--sync-every 8 --compress int8"

Each run is a `hetrain train` command, as a user would start it (8 workers, digits MLP, 50 ms of
emulated compute, worker 0 five times slower, `--on-failure continue` or `respawn`). A thread
of this script waits for a wall time drawn uniformly between the launch and the job's expected
end (start-up + budget + 2 s), finds the worker's process by its name (`hetrain-wR`, in /proc; if the launcher has not
forked it yet, as soon as it has) and sends it SIGKILL, or SIGSTOP (the run then has `--heartbeat-timeout 5`). The rank is drawn
among 1-7 (the parameter server is rank 0: its death ends a `ps` job by design, and is tested on
its own). A kill whose moment comes after the worker exited (the job's end) finds no process and is
counted as such.

A run *survived* when its strike found a process, the command exits 0 and the averaged model of the
survivors reaches 0.95 test accuracy (a strike that found none is counted under "no process" only); a *hang* is a command still running 120 s after its budget. The phase a kill landed
in comes from the run's record: before every worker's first iteration (`startup_s`), during the
training loop, or after it (finish, evaluation, exit). Recovery = the longest time from a death to
every survivor computing again (`deaths[].recovery_s`). Writes OUT/chaos.json and OUT/chaos.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from hetrain.testing.processes import worker_pids

ROOT = Path(__file__).resolve().parents[1]
PROTOCOLS = ("hop", "dpsgd", "prague", "adpsgd", "ps")
HANG_GRACE_S = 120.0
STARTUP_ESTIMATE_S = 3.0


def one_run(protocol: str, mode: str, sig: int, rank: int, at_s: float, budget_s: float, out: Path,
            train_args: tuple[str, ...] = ()) -> dict:
    command = [sys.executable, "-m", "hetrain", "train", "--protocol", protocol, "--workers", "8",
               "--compute-ms", "50", "--slowdown", "0:5x", "--time-budget", str(budget_s),
               "--on-failure", mode, "--no-progress", "--out", str(out), *train_args]
    if sig == signal.SIGSTOP:
        command += ["--heartbeat-timeout", "5"]
    sent: dict = {}
    began = time.monotonic()
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)

    def strike() -> None:
        seen = False  # its process existed before the moment came (so if gone then, it has exited)
        while proc.poll() is None:
            pid = worker_pids(under=proc.pid).get(rank)
            seen = seen or pid is not None
            if time.monotonic() - began >= at_s:
                if pid is not None:
                    break
                if seen:  # exited (the job's end): nothing to kill
                    sent["found"] = False
                    return
                # not forked yet (the launcher's own start-up): strike as soon as it is
            time.sleep(0.05 if time.monotonic() - began < at_s - 0.1 else 0.002)  # /proc scans cost CPU
        else:
            sent["found"] = False
            return
        os.kill(pid, sig)
        sent.update(found=True, at_s=time.monotonic() - began)

    threading.Thread(target=strike, daemon=True).start()
    try:
        output, _ = proc.communicate(timeout=budget_s + STARTUP_ESTIMATE_S + HANG_GRACE_S)
        hang = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        hang = True
    elapsed = time.monotonic() - began
    metrics = json.loads((out / "metrics.json").read_text()) if (out / "metrics.json").exists() else {}
    accuracy = metrics.get("final_accuracy_avg_model")
    recoveries = [d.get("recovery_s") for d in metrics.get("deaths", [])]
    return {
        "protocol": protocol, "mode": mode, "signal": signal.Signals(sig).name, "rank": rank,
        "planned_at_s": at_s, "sent_at_s": sent.get("at_s"), "found_process": sent.get("found"),
        "rc": None if hang else proc.returncode, "hang": hang, "elapsed_s": elapsed,
        "accuracy": accuracy,  # a strike that found no process survived nothing: not counted as survived
        "survived": bool(sent.get("found")) and not hang and proc.returncode == 0 and (accuracy or 0) >= 0.95,
        "phase": _phase(sent, metrics), "deaths": [(d["rank"], d.get("cause")) for d in metrics.get("deaths", [])],
        "recovery_s": max((r for r in recoveries if r is not None), default=None),
        "error": None if proc.returncode == 0 else output.strip().splitlines()[-1][:300] if output.strip() else "",
    }


def _phase(sent: dict, metrics: dict) -> str:
    """Where the kill landed: start-up, training or after training; 'no process' if it found none."""
    if not sent.get("found"):
        return "no process"
    startup = metrics.get("startup_s")
    if startup is None or metrics.get("wall_time_s") is None:
        return "unknown (no record)"
    at = sent["at_s"]  # startup_s counts from the command's start too
    if at < startup:
        return "start-up"
    if at < startup + metrics["wall_time_s"]:
        return "training"
    return "after training"


def markdown(rows: list[dict]) -> str:
    lines = ["| protocol | mode | signal | runs | exit 0 | accuracy >= 0.95 | survived (both) | hangs | no process | "
             "phases (start-up / training / after) | worst recovery (s) | lowest accuracy |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["protocol"], r["mode"], r["signal"]), []).append(r)
    for (protocol, mode, sig), runs in groups.items():
        phases = [sum(r["phase"] == p for r in runs) for p in ("start-up", "training", "after training")]
        worst = max((r["recovery_s"] for r in runs if r["recovery_s"] is not None), default=None)
        lowest = min((r["accuracy"] for r in runs if r["accuracy"] is not None), default=None)
        lines.append(f"| {protocol} | {mode} | {sig} | {len(runs)} | {sum(r['rc'] == 0 for r in runs)} | "
                     f"{sum((r['accuracy'] or 0) >= 0.95 for r in runs)} | {sum(r['survived'] for r in runs)} | "
                     f"{sum(r['hang'] for r in runs)} | {sum(r['phase'] == 'no process' for r in runs)} | "
                     f"{' / '.join(map(str, phases))} | {'-' if worst is None else f'{worst:.2f}'} | "
                     f"{'-' if lowest is None else f'{lowest:.3f}'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/chaos")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS))
    parser.add_argument("--modes", default="continue,respawn")
    parser.add_argument("--runs", type=int, default=20, help="SIGKILL runs per protocol and mode")
    parser.add_argument("--stops", type=int, default=5, help="SIGSTOP runs per protocol and mode")
    parser.add_argument("--budget", type=float, default=60.0, help="each run's --time-budget (s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-args", default="", help="more `hetrain train` arguments for every run, as one "
                        "string (e.g. \"--sync-every 8 --compress int8 --outer-optimizer nesterov\")")
    args = parser.parse_args()
    try:
        train_args = tuple(shlex.split(args.train_args))
    except ValueError as exc:
        parser.error(f"--train-args: {exc} (quote it as one shell string)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    rows = []
    for protocol in args.protocols.split(","):
        for mode in args.modes.split(","):
            if protocol == "ps" and mode == "respawn":
                continue  # ps cannot respawn (hetrain train refuses it)
            for index, sig in enumerate([signal.SIGKILL] * args.runs + [signal.SIGSTOP] * args.stops):
                rank = rng.randrange(1, 8)
                at_s = rng.uniform(0.0, STARTUP_ESTIMATE_S + args.budget + 2.0)
                row = one_run(protocol, mode, sig, rank, at_s, args.budget, out / f"{protocol}-{mode}-{index}",
                              train_args)
                rows.append(row)
                print(json.dumps(row), flush=True)
    (out / "chaos.json").write_text(json.dumps(rows, indent=2) + "\n")
    table = markdown(rows)
    (out / "chaos.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
