"""SIGTERM benchmark: a scheduler's stop at a random moment of a run, start-up and finish included.

    .venv/bin/python benchmarks/sigterm_bench.py --out runs/sigterm                 # 30 runs (~6 min)
    .venv/bin/python benchmarks/sigterm_bench.py --out runs/sigterm --runs 10 --seed 3

Each run is a `hetrain train` command as a user would start it (4 workers, digits MLP, 20 ms of
emulated compute, a 6 s budget, a protocol drawn from all six), in its own session as a shell job
is. At a moment drawn from 0.3-12 s after the command starts (start-up takes seconds here, so some
moments fall in start-up, most in training, a few in the finish or after the end), SIGTERM goes to
the launcher alone (as Kubernetes and ``docker stop`` send it) or to every process of the job, the
warm server and the workers included (as systemd and Slurm's ``scancel`` do).

A run is *clean* when the command exits 143 (or 0 if it had ended before the signal), with no
traceback, no process it had started is alive 1 s later, and where it wrote a record no worker was
lost (the record says ``interrupted_by: SIGTERM`` when the signal stopped training; one that came as
the workers had ended leaves a whole record); a *hang* is a command still running 120 s after the
signal. In start-up the command leaves with no record ("terminated"). Writes OUT/sigterm.json (one row per run) and OUT/sigterm.md (the table).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTOCOLS = ("allreduce", "dpsgd", "hop", "prague", "adpsgd", "ps")
HANG_S = 120.0


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def one_run(protocol: str, to: str, at_s: float, out: Path) -> dict:
    command = [sys.executable, "-m", "hetrain", "train", "--protocol", protocol, "--workers", "4",
               "--compute-ms", "20", "--time-budget", "6", "--no-progress", "--out", str(out)]
    began = time.monotonic()
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    time.sleep(at_s)
    started = _descendants(proc.pid)
    ended_before = proc.poll() is not None
    if not ended_before:
        for pid in [proc.pid, *started] if to == "every-process" else [proc.pid]:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    sent = time.monotonic()
    try:
        code = proc.wait(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code = "hang"
    exit_s = time.monotonic() - sent
    err = proc.stderr.read().decode(errors="replace")
    time.sleep(1.0)
    left = [pid for pid in started if _alive(pid)]
    record = json.loads((out / "metrics.json").read_text()) if (out / "metrics.json").exists() else None
    clean = (code in ((0, 143) if ended_before else (143,)) and not left and "Traceback" not in err
             and (record is None or record.get("workers_lost") == 0))
    lines = [line for line in err.splitlines() if line.startswith("hetrain")]
    return {"protocol": protocol, "to": to, "at_s": round(at_s, 2), "since_start_s": round(sent - began, 2),
            "exit_code": code, "exit_s": round(exit_s, 2), "record": record is not None,
            "interrupted_by": (record or {}).get("interrupted_by"),
            "iterations": (record or {}).get("total_iterations"), "processes_left": left, "clean": clean,
            "message": lines[-1] if lines else "", "error_tail": "" if clean else err[-1500:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/sigterm")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    rows = []
    for i in range(args.runs):
        protocol, to, at_s = rng.choice(PROTOCOLS), rng.choice(["launcher", "every-process"]), rng.uniform(0.3, 12)
        rows.append(one_run(protocol, to, at_s, out / f"run{i:03d}"))
        row = rows[-1]
        print(f"{i + 1}/{args.runs} {protocol:9s} {to:13s} at {at_s:5.2f} s: exit {row['exit_code']} in "
              f"{row['exit_s']:.2f} s, record {'yes' if row['record'] else 'no '}, "
              f"{'clean' if row['clean'] else 'NOT CLEAN'}  {row['message']}", flush=True)
    (out / "sigterm.json").write_text(json.dumps(rows, indent=1))
    header = "| run | protocol | to | at (s) | exit code | exit after (s) | record | clean | last line |\n|" + "---|" * 9
    table = [header] + [f"| {i} | {r['protocol']} | {r['to']} | {r['at_s']} | {r['exit_code']} | {r['exit_s']} | "
                        f"{'yes' if r['record'] else 'no'} | {'yes' if r['clean'] else '**no**'} | {r['message']} |"
                        for i, r in enumerate(rows)]
    clean = sum(r["clean"] for r in rows)
    summary = (f"{clean} of {len(rows)} clean; records written {sum(r['record'] for r in rows)}; "
               f"slowest exit after the signal {max(r['exit_s'] for r in rows):.2f} s")
    (out / "sigterm.md").write_text("\n".join(table) + "\n\n" + summary + "\n")
    print(summary)
    sys.exit(0 if clean == len(rows) else 1)


if __name__ == "__main__":
    main()
