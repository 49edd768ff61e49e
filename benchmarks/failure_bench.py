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

Every protocol is charged the same costs. Columns of OUT/failures.md (keys of
OUT/failures.json in brackets):

* goodput, whole job (``goodput``) = counted samples / elapsed wall time of
  the whole job as the user waits for it: from the benchmark's call that
  launches the job to the returned record, i.e. start-up (loading the data,
  forking the workers from the warm server, their set-up and connect), training
  (a replacement's start included), the launcher's evaluation of the
  snapshots and writing the record; for the restarted allreduce, every
  attempt, the time lost between a kill and the restart, and each restart's
  start-up and checkpoint loading. The same for the failure-free rows.
* goodput, training loop only (``goodput_loop``) = the same counted samples /
  the training loop's time only (``metrics["wall_time_s"]``, the longest
  worker's loop); for the restarted allreduce, the sum of the attempts' loop
  times, a killed attempt's loop taken as its kill time (it writes no record).
  It leaves out what the whole-job column charges, and is not the figure a
  user waits for.
* counted samples (``counted_samples``): iterations that count x batch. For
  every job with its own record (decentralized protocols, failure-free
  allreduce): ``metrics["goodput_samples_per_s"] * metrics["wall_time_s"]`` =
  max(0, total iterations - deaths) x batch (``hetrain/jobs/run.py``
  ``finalize_run``: a dead worker's last gradient may never have left it). For
  the restarted allreduce: the last attempt's final iteration (the counter goes
  on from the checkpoint) x workers x batch; the iterations after the last
  checkpoint before a kill are computed twice and count once.
* vs failure-free: whole-job goodput / the same protocol's failure-free
  whole-job goodput (allreduce with restarts against failure-free allreduce).
* elapsed (s) (``elapsed_s``): the whole-job denominator; ``wall_s``: the
  loop-only denominator.

Left out of every row alike: this process's own imports and the warm server's
one-time start (``hetrain.jobs.warm_start``), which an untimed 2-worker warm-up
job pays before the first row, so that the row run first (failure-free
allreduce) does not pay it alone. A fresh ``hetrain train`` command pays them
once more per job (its launcher's 1.9 s, ``docs/results/2026-12-02-start-up.md``, "Start-up").
The restarted allreduce's attempts start warm workers from the same server; a
torchrun restart starts fresh interpreters and costs more.

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
    elapsed = time.perf_counter() - began  # launch to record: start-up, training, evaluation, writing
    counted = round(metrics["goodput_samples_per_s"] * metrics["wall_time_s"])  # (iterations - deaths) x batch
    label = protocol if fail == "none" else f"{protocol} ({on_failure})"
    return {"protocol": label, "failures": fail != "none", "workers_lost": metrics.get("workers_lost", 0),
            "workers_joined": metrics.get("workers_joined", 0),
            "join_s": [j["join_s"] for j in metrics.get("joins", [])],
            "counted_samples": counted, "wall_s": metrics["wall_time_s"], "elapsed_s": elapsed,
            "goodput": counted / elapsed, "goodput_loop": metrics["goodput_samples_per_s"],
            "final_accuracy": metrics["final_accuracy_avg_model"], "final_loss": metrics["final_loss_avg_model"],
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
            trained_s = pending[0][0] + trained_s  # the job's loop ran until the kill
    elapsed = time.perf_counter() - began  # every attempt, from the first launch to the last record
    samples = counted * base.num_workers * base.batch_size
    return {"protocol": "allreduce (restart from checkpoint)", "failures": True, "workers_lost": restarts,
            "workers_joined": 0, "join_s": [],
            "counted_samples": samples, "wall_s": trained_s, "elapsed_s": elapsed,
            "goodput": samples / elapsed, "goodput_loop": samples / trained_s,
            "final_accuracy": metrics["final_accuracy_avg_model"], "final_loss": metrics["final_loss_avg_model"],
            "recovery_s": []}


def warm_up(out: Path) -> None:
    """An untimed job: the warm server starts (imports torch and hetrain) here, not in the first timed row."""
    run_training(RunConfig(num_workers=2, workload="mlp", compute_ms=1.0, iterations=3, timeout_s=120.0),
                 str(out / "warm-up"), progress=False)


def markdown(rows: list[dict]) -> str:
    lines = ["| workload | protocol | failures | workers lost | joined | goodput, whole job (samples/s) | "
             "vs failure-free | goodput, training loop only (samples/s) | elapsed (s) | "
             "final accuracy | final loss | recovery (s) | replacement ready after (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    calm = {(r["workload"], r["protocol"]): r["goodput"] for r in rows if not r["failures"]}
    for r in rows:
        key = (r["workload"], r["protocol"].split(" ")[0])
        ratio = r["goodput"] / calm[key] if key in calm and calm[key] else None
        rec = ", ".join("-" if x is None else f"{x:.1f}" for x in r["recovery_s"]) or "-"
        ready = ", ".join(f"{x:.1f}" for x in r.get("join_s", [])) or "-"
        lines.append(f"| {r['workload']} | {r['protocol']} | {'yes' if r['failures'] else 'no'} | {r['workers_lost']} "
                     f"| {r.get('workers_joined', 0)} | {r['goodput']:.0f} | {'-' if ratio is None else f'{ratio:.3f}'} "
                     f"| {r['goodput_loop']:.0f} | {r['elapsed_s']:.1f} "
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
    warm_up(out)
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
