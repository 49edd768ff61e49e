"""Failure benchmark: goodput when a worker is killed every minute, against the same run with no failure.

    .venv/bin/python benchmarks/failure_bench.py --out runs/failures                 # digits and lm, 300 s each
    .venv/bin/python benchmarks/failure_bench.py --out runs/failures --workloads mlp --duration 120   # quicker

8 workers, worker 0 five times slower. Kills (SIGKILL, for real) at 60, 120,
180 and 240 s of training, of workers 3, 5, 6 and 7. For hop, prague and adpsgd:
``--on-failure continue`` (the survivors go on) and ``respawn`` (a replacement
joins) against the failure-free run. For allreduce, what a
torchrun user gets: the job dies with the worker and restarts from its last
checkpoint (``--checkpoint-every 10``, ``--resume``) with all 8 workers, until
the budget is spent; its wall time includes the restarts.

Goodput = samples of the iterations that count / wall time. For the
decentralized protocols every computed gradient reached the model (a dead
worker's unfinished iteration is not counted); for the restarted allreduce the
iterations after the last checkpoint are computed twice and count once.
Writes OUT/failures.md and OUT/failures.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from hetrain.config import RunConfig
from hetrain.errors import WorkerError
from hetrain.jobs.run import run_training

KILLS = [(60.0, 3), (120.0, 5), (180.0, 6), (240.0, 7)]
WORKLOADS = {
    "mlp": dict(workload="mlp", compute_ms=50.0),
    "lm": dict(workload="lm", batch_size=16),
}


def _fail_spec(duration_s: float) -> str:
    kills = [(t * duration_s / 300.0, w) for t, w in KILLS]  # a kill every fifth of the run
    return ",".join(f"{w}@{t:g}s" for t, w in kills)


def decentralized(base: RunConfig, protocol: str, fail: str, out: Path, on_failure: str = "continue") -> dict:
    config = base.replace(protocol=protocol, fail=fail, on_failure=on_failure if fail != "none" else None)
    began = time.perf_counter()
    metrics = run_training(config, str(out), progress=False)
    label = protocol if fail == "none" else f"{protocol} ({on_failure})"
    return {"protocol": label, "failures": fail != "none", "workers_lost": metrics.get("workers_lost", 0),
            "workers_joined": metrics.get("workers_joined", 0),
            "join_s": [j["join_s"] for j in metrics.get("joins", [])],
            "wall_s": metrics["wall_time_s"], "elapsed_s": time.perf_counter() - began,
            "goodput": metrics["samples_per_s"], "final_accuracy": metrics["final_accuracy_avg_model"],
            "final_loss": metrics["final_loss_avg_model"],
            "recovery_s": [d.get("recovery_s") for d in metrics.get("deaths", [])]}


def allreduce_restarts(base: RunConfig, duration_s: float, out: Path) -> dict:
    """DDP dies with any worker; restart from the last checkpoint until ``duration_s`` of training is done."""
    ckpt = out / "checkpoints"
    shutil.rmtree(ckpt, ignore_errors=True)
    kills = [(t * duration_s / 300.0, w) for t, w in KILLS]
    began = time.perf_counter()
    trained_s, restarts, attempt, counted = 0.0, 0, 0, 0
    while trained_s < duration_s - 1:
        pending = [(t - trained_s, w) for t, w in kills if t > trained_s]
        fail = f"{pending[0][1]}@{pending[0][0]:g}s" if pending else "none"
        config = base.replace(protocol="allreduce", time_budget_s=duration_s - trained_s, fail=fail,
                              on_failure="abort", checkpoint_dir=str(ckpt), checkpoint_every_s=10.0,
                              resume=attempt > 0)
        attempt += 1
        try:
            metrics = run_training(config, str(out / f"attempt-{attempt}"), progress=False)
            trained_s += metrics["wall_time_s"]
            counted = metrics["workers"][0]["iteration"]  # everything since the last resume counted
            break
        except WorkerError:
            restarts += 1
            trained_s = pending[0][0] + trained_s  # the job ran until the kill
    wall = time.perf_counter() - began
    return {"protocol": "allreduce (restart from checkpoint)", "failures": True, "workers_lost": restarts,
            "workers_joined": 0, "join_s": [],
            "wall_s": wall, "elapsed_s": wall, "goodput": counted * base.num_workers * base.batch_size / wall,
            "final_accuracy": metrics["final_accuracy_avg_model"], "final_loss": metrics["final_loss_avg_model"],
            "recovery_s": []}


def markdown(rows: list[dict]) -> str:
    lines = ["| workload | protocol | failures | workers lost | joined | goodput (samples/s) | vs failure-free | "
             "final accuracy | final loss | recovery (s) | replacement ready after (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    calm = {(r["workload"], r["protocol"]): r["goodput"] for r in rows if not r["failures"]}
    for r in rows:
        key = (r["workload"], r["protocol"].split(" ")[0])
        ratio = r["goodput"] / calm[key] if key in calm and calm[key] else None
        rec = ", ".join("-" if x is None else f"{x:.1f}" for x in r["recovery_s"]) or "-"
        ready = ", ".join(f"{x:.1f}" for x in r.get("join_s", [])) or "-"
        lines.append(f"| {r['workload']} | {r['protocol']} | {'yes' if r['failures'] else 'no'} | {r['workers_lost']} "
                     f"| {r.get('workers_joined', 0)} | {r['goodput']:.0f} | {'-' if ratio is None else f'{ratio:.3f}'} "
                     f"| {r['final_accuracy']:.4f} | {r['final_loss']:.3f} | {rec} | {ready} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/failures")
    parser.add_argument("--duration", type=float, default=300.0)
    parser.add_argument("--workloads", default="mlp,lm")
    parser.add_argument("--protocols", default="hop,prague,adpsgd")
    parser.add_argument("--modes", default="continue,respawn", help="--on-failure modes to run with failures")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for workload in args.workloads.split(","):
        base = RunConfig(num_workers=8, slowdown="0:5x", time_budget_s=args.duration, timeout_s=120.0,
                         **WORKLOADS[workload])
        fail = _fail_spec(args.duration)
        for protocol in ["allreduce", *args.protocols.split(",")]:
            modes = [("none", None), (fail, "restart")] if protocol == "allreduce" else \
                [("none", None)] + [(fail, mode) for mode in args.modes.split(",")]
            for spec, mode in modes:
                print(f"== {workload} {protocol} fail={spec} {mode or ''}", file=sys.stderr, flush=True)
                if mode == "restart":
                    row = allreduce_restarts(base, args.duration, out / workload / "allreduce-restarts")
                else:
                    name = f"{protocol}-{mode or 'calm'}"
                    row = decentralized(base, protocol, spec, out / workload / name, mode or "continue")
                rows.append({"workload": workload, **row})
                (out / "failures.json").write_text(json.dumps(rows, indent=2) + "\n")
                (out / "failures.md").write_text(markdown(rows))
    print(markdown(rows), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
