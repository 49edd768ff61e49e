"""Ray chaos benchmark: one worker actor's process SIGKILLed from outside, by pid, at a random moment.

    .venv/bin/python benchmarks/ray_chaos_bench.py --out runs/ray-chaos                  # 8 runs per mode
    .venv/bin/python benchmarks/ray_chaos_bench.py --out runs/ray-chaos --runs 20 --modes respawn

A two-node Ray cluster from Ray's own harness (``ray.cluster_utils.Cluster``, every node on loopback,
2 CPUs each), kept for all runs. Each run is ``hetrain train --launcher ray``'s function
(:func:`hetrain.ray.training.run_training_ray`): hop, 4 workers, 50 ms of emulated compute, rank 0 three
times slower, ``--time-budget`` seconds of training, ``--on-failure`` continue or respawn. A thread of
this script waits for a wall time drawn uniformly between the call and the job's expected end
(start-up, budget and finish: ``--window``), finds the worker actors' processes in /proc (command
line ``ray::WorkerActor...``; a replacement's too) and SIGKILLs one of them at random. A kill before
any actor exists, or after the job ended, finds none and is counted as such.

A run *survived* when its strike killed an actor and the call returns a record (no error) in which the
averaged model reaches 0.9 test accuracy (a strike that found none is not a survival: ``struck`` false). Writes OUT/ray_chaos.json, each run's record and log under OUT/MODE-I/, and prints one
line per run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read as Ray is imported: loopback stays loopback
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ray_bench import job_config, start_cluster  # noqa: E402 (after the environment above)

ACTOR_TITLE = "ray::WorkerActor"


def actor_pids() -> list[int]:
    """The pids of every hetrain worker actor on this machine (Ray titles them ``ray::WorkerActor...``)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    if handle.read().startswith(ACTOR_TITLE.encode()):
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def strike(at_s: float, began: float, rng: random.Random, log: dict, done: threading.Event) -> None:
    while time.monotonic() - began < at_s:
        if done.wait(0.02):
            log["kill"] = "job ended first"
            return
    pids = actor_pids()
    if not pids:
        log["kill"] = "no actor yet"
        return
    pid = rng.choice(pids)
    try:
        with open(f"/proc/{pid}/comm") as handle:  # hetrain-wR once the actor runs its worker
            name = handle.read().strip()
    except OSError:
        name = "?"
    try:
        os.kill(pid, signal.SIGKILL)
        log["kill"] = f"{name} (pid {pid}) at {time.monotonic() - began:.2f} s"
        log["struck"] = True
    except ProcessLookupError:
        log["kill"] = f"pid {pid} gone"


def one_run(address: str, mode: str, args, rng: random.Random, out_dir: Path | None = None) -> dict:
    from hetrain.ray.training import run_training_ray

    config = job_config(args, 4, args.budget, mode)
    at_s = rng.uniform(0.0, args.window)
    log: dict = {"mode": mode, "kill_at_s": round(at_s, 2)}
    done = threading.Event()
    began = time.monotonic()
    thread = threading.Thread(target=strike, args=(at_s, began, rng, log, done), daemon=True)
    thread.start()
    try:
        metrics = run_training_ray(config, str(out_dir) if out_dir else None, address, {"CPU": 1}, progress=False)
        struck = log.get("struck", False)  # the strike killed an actor (else it found none)
        log.update(survived=struck and metrics["final_accuracy_avg_model"] >= 0.9, struck=struck,
                   lost=metrics["workers_lost"],
                   joined=metrics["workers_joined"], accuracy=round(metrics["final_accuracy_avg_model"], 4))
    except Exception as error:  # noqa: BLE001 - a failed job is what this counts
        log.update(survived=False, error=str(error)[:300])
    finally:
        done.set()
    log["wall_s"] = round(time.monotonic() - began, 1)
    thread.join(5)
    return log


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for ray_chaos.json")
    parser.add_argument("--modes", default="continue,respawn")
    parser.add_argument("--runs", type=int, default=8, help="runs per mode")
    parser.add_argument("--budget", type=float, default=8.0, help="seconds of training per run")
    parser.add_argument("--window", type=float, default=14.0, help="kills fall uniformly in [0, WINDOW] s of each run")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    args.protocol, args.compute_ms, args.slowdown = "hop", 50.0, "0:3x"
    import ray

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    cluster = start_cluster(0, [2, 2])
    rows = []
    try:
        ray.init(address=cluster.address, _node_ip_address="127.0.0.1")
        for mode in args.modes.split(","):
            for index in range(args.runs):
                rows.append(one_run(cluster.address, mode, args, rng, out / f"{mode}-{index}"))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    summary = {mode: {"runs": sum(r["mode"] == mode for r in rows),
                      "struck": sum(r["mode"] == mode and r.get("struck", False) for r in rows),
                      "survived": sum(r["mode"] == mode and r["survived"] for r in rows),
                      "slowest_s": max((r["wall_s"] for r in rows if r["mode"] == mode), default=None)}
               for mode in args.modes.split(",")}
    (out / "ray_chaos.json").write_text(json.dumps({"args": vars(args), "summary": summary, "runs": rows}, indent=1))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
