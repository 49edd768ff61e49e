"""Ray benchmark: a job on Ray actors against the local launcher, and under node churn against no churn.

    .venv/bin/python benchmarks/ray_bench.py --out runs/ray                       # both, as docs/results/2026-12-04-ray-node-churn.md
    .venv/bin/python benchmarks/ray_bench.py --out runs/ray --mode churn --seconds 300 --period 60 --back-after 30

Every cluster is Ray's own multi-node harness (``ray.cluster_utils.Cluster``) on this machine, every node
on loopback (``node_ip_address=127.0.0.1``, ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``), no dashboard.

``--mode steady``: the same failure-free job (hop, ``--workers``, ``--compute-ms`` emulated compute,
``--slowdown``, ``--steady-seconds`` of training) with the local launcher (``hetrain.jobs.run.run_training``)
and on a one-node Ray cluster (``hetrain.ray.training.run_training_ray``), one after the other. Figures:
``samples_per_s`` of the record (the training loop) and the whole job's rate (counted samples / seconds from
the call to the returned record: start-up, training, evaluation).

``--mode churn``: ``--nodes`` nodes of ``--workers-per-node`` workers (each node declares that many CPUs;
the driver's head node declares none, so it is never lost), hop, ``--slowdown`` (default: rank 0 three
times slower), ``--seconds`` of training. With ``respawn``, the node holding the lowest live rank is
removed every ``--period`` s of training (``Cluster.remove_node``: its raylet and actors die) and a fresh
node is added ``--back-after`` s later; the lost workers' replacements wait for it. Then the same job
with no churn. Figures:

* goodput = counted samples / seconds from the launching call to the job's results (start-up and
  recovery included). Counted samples = (iterations of every process, the dead ones' last report
  included, minus one per death: a dead worker's last gradient may never have left it) x batch;
* ``detect_s``: node removed -> the driver records the deaths (Ray reports the actors dead);
* ``recovery_s``: node removed -> every survivor has computed again (its next progress report);
* ``ready_s``: the fresh node added (``add_node`` returned: capacity is back) -> the replacement joined
  (the driver admitted it: it trains and its neighbours talk to it); None where the replacements had
  joined before (``--spare-per-node``: the survivors had room for them);
* ``ready_after_loss_s``: node removed -> every replacement of its workers joined.

``--spare-per-node K``: every worker node declares K CPUs beyond its workers', so the placement group's
bundles of a lost node are placed again at once on the survivors (Ray's rescheduling) and the
replacements start there, not when a node comes back.

A torchrun comparison (``--max-restarts --resume`` on the same losses) is not part of this script
(docs/results/2026-12-04-torchrun-churn.md, says why).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read as Ray is imported: loopback stays loopback

OBJECT_STORE_BYTES = 80 * 2**20


def node_args(num_cpus: int, **extra) -> dict:
    return dict(node_ip_address="127.0.0.1", num_cpus=num_cpus, object_store_memory=OBJECT_STORE_BYTES, **extra)


def start_cluster(head_cpus: int, nodes: list[int]):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args=node_args(head_cpus, include_dashboard=False))
    for cpus in nodes:
        cluster.add_node(**node_args(cpus))
    cluster.wait_for_nodes()
    return cluster


def node_cpus(args) -> int:
    """The CPUs a worker node declares: its workers' and ``--spare-per-node`` more (room for replacements)."""
    return args.workers_per_node + args.spare_per_node


def job_config(args, workers: int, seconds: float, on_failure: str):
    from hetrain.config import RunConfig

    return RunConfig(protocol=args.protocol, num_workers=workers, compute_ms=args.compute_ms, slowdown=args.slowdown,
                     time_budget_s=seconds, timeout_s=60.0, on_failure=on_failure, log=())


def counted_samples(metrics: dict, batch_size: int) -> int:
    return max(0, metrics["total_iterations"] - metrics["workers_lost"]) * batch_size


# ----- steady: the local launcher against Ray on one machine --------------------------------------------
def steady(args) -> dict:
    import ray

    from hetrain.jobs.run import run_training
    from hetrain.ray.training import run_training_ray

    config = job_config(args, args.workers, args.steady_seconds, "continue")
    began = time.monotonic()
    local = run_training(config, None, progress=False)
    local_s = time.monotonic() - began
    cluster = start_cluster(args.workers, [])
    try:
        ray.init(address=cluster.address, _node_ip_address="127.0.0.1")
        began = time.monotonic()
        on_ray = run_training_ray(config, None, None, {"CPU": 1}, progress=False)
        ray_s = time.monotonic() - began
    finally:
        ray.shutdown()
        cluster.shutdown()
    rows = {}
    for name, metrics, whole_s in (("local", local, local_s), ("ray", on_ray, ray_s)):
        rows[name] = {"samples_per_s": metrics["samples_per_s"], "whole_job_s": whole_s,
                      "whole_job_samples_per_s": counted_samples(metrics, config.batch_size) / whole_s,
                      "startup_s": metrics.get("startup_s"), "final_accuracy": metrics["final_accuracy_avg_model"]}
    rows["ray_vs_local_samples_per_s"] = rows["ray"]["samples_per_s"] / rows["local"]["samples_per_s"]
    rows["ray_vs_local_whole_job"] = rows["ray"]["whole_job_samples_per_s"] / rows["local"]["whole_job_samples_per_s"]
    return rows


# ----- churn: nodes lost and added back, respawn against no churn --------------------------------------
class Churn:
    """On the driver's thread (each progress report): the schedule of node losses and returns, and the
    moments each event happened (``time.monotonic()``)."""

    def __init__(self, cluster, args):
        self.cluster, self.args = cluster, args
        self.node_of: dict[int, str] = {}
        self.t_s = 0.0
        self.removals: list[dict] = []  # {"at", "t_s", "ranks", "added_at", "deaths_at", "joins_at"}
        self.pending_add: dict | None = None

    def on_message(self, rank: int, message: dict) -> None:
        if "node" in message:
            self.node_of[rank] = message["node"]
        self.t_s = max(self.t_s, message.get("t_s", 0.0))
        due = (len(self.removals) + 1) * self.args.period
        if self.pending_add is None and self.t_s >= due and due < self.args.seconds:
            self._remove()
        elif self.pending_add is not None and self.t_s >= self.pending_add["t_s"] + self.args.back_after:
            self.cluster.add_node(**node_args(node_cpus(self.args)))
            self.pending_add["added_at"] = time.monotonic()
            self.pending_add = None

    def _remove(self) -> None:
        victim_rank = min(r for r in self.node_of if self.node_of[r] in {n.node_id for n in self.cluster.worker_nodes})
        victim = next(n for n in self.cluster.worker_nodes if n.node_id == self.node_of[victim_rank])
        ranks = sorted(r for r, node in self.node_of.items() if node == victim.node_id)
        for rank in ranks:
            del self.node_of[rank]
        self.cluster.remove_node(victim)
        self.pending_add = {"at": time.monotonic(), "t_s": self.t_s, "ranks": ranks, "added_at": None,
                            "deaths_at": {}, "joins_at": {}}
        self.removals.append(self.pending_add)

    def _event_of(self, rank: int) -> dict | None:
        return next((r for r in reversed(self.removals) if rank in r["ranks"]), None)

    def on_death(self, rank: int) -> None:
        event = self._event_of(rank)
        if event is not None:
            event["deaths_at"].setdefault(rank, time.monotonic())

    def on_join(self, rank: int, incarnation: int) -> None:
        event = self._event_of(rank)
        if event is not None:
            event["joins_at"].setdefault(rank, time.monotonic())


def reporting_worker(ctx, config, services, data):
    """``hetrain train``'s worker, after telling the driver its node (the churn picks nodes by rank)."""
    import ray

    from hetrain.jobs.train_worker import train_worker

    ctx.report({"node": ray.get_runtime_context().get_node_id()})
    return train_worker(ctx, config, services, data)


def run_churn_job(args, churned: bool) -> dict:
    import ray

    from hetrain.data import load_dataset
    from hetrain.ray.actors import RayPlacement
    from hetrain.ray.connection import actor_env
    from hetrain.ray.job import run_ray

    workers = args.nodes * args.workers_per_node
    config = job_config(args, workers, args.seconds, "respawn")
    cluster = start_cluster(0, [node_cpus(args)] * args.nodes)
    churn = Churn(cluster, args) if churned else None
    try:
        ray.init(address=cluster.address, _node_ip_address="127.0.0.1")  # reporting_worker goes by value
        data = load_dataset(config.workload, config.seed)
        placement = RayPlacement({"CPU": 1.0}, "127.0.0.1", actor_env("127.0.0.1"))
        began = time.monotonic()
        results = run_ray(reporting_worker, workers, (config, {}, data), placement=placement,
                          timeout_s=config.timeout_s, on_failure="respawn", heartbeat_timeout_s=30.0,
                          on_message=churn.on_message if churn else None,
                          on_death=churn.on_death if churn else None, on_join=churn.on_join if churn else None)
        whole_s = time.monotonic() - began
    finally:
        ray.shutdown()
        cluster.shutdown()
    iterations = sum(r["worker"]["iterations"] for r in results if r is not None)
    iterations += sum(d["computed"] for d in results.deaths)
    counted = max(0, iterations - len(results.deaths)) * config.batch_size
    row = {"whole_job_s": whole_s, "counted_samples": counted, "goodput": counted / whole_s,
           "deaths": len(results.deaths), "joins": len(results.joins)}
    if churn is not None:
        losses = []
        for event in churn.removals:
            deaths = [d for d in results.deaths if d["rank"] in event["ranks"] and d["wall_s"] >= event["at"]
                      and d["incarnation"] == min(x["incarnation"] for x in results.deaths
                                                  if x["rank"] == d["rank"] and x["wall_s"] >= event["at"])]
            # every survivor computing again: the latest of this loss's deaths' recoveries, from the removal
            recovered = [d["wall_s"] + d["recovery_s"] for d in deaths if d.get("recovery_s") is not None]
            losses.append({
                "t_s": round(event["t_s"], 1), "ranks": event["ranks"], "joined": len(event["joins_at"]),
                "added_after_s": event["added_at"] - event["at"] if event["added_at"] else None,
                "detect_s": max((t - event["at"] for t in event["deaths_at"].values()), default=None),
                "recovery_s": max(recovered) - event["at"] if len(recovered) == len(event["ranks"]) else None,
                "ready_s": (max(event["joins_at"].values()) - event["added_at"]
                            if event["added_at"] and len(event["joins_at"]) == len(event["ranks"])
                            and max(event["joins_at"].values()) > event["added_at"] else None),
                "ready_after_loss_s": (max(event["joins_at"].values()) - event["at"]
                                       if len(event["joins_at"]) == len(event["ranks"]) else None)})
        row["losses"] = losses
    return row


def churn(args) -> dict:
    with_churn = run_churn_job(args, churned=True)
    without = run_churn_job(args, churned=False)
    return {"respawn_with_churn": with_churn, "failure_free": without,
            "goodput_vs_failure_free": with_churn["goodput"] / without["goodput"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for ray.json")
    parser.add_argument("--mode", choices=("steady", "churn", "all"), default="all")
    parser.add_argument("--protocol", default="hop")
    parser.add_argument("--compute-ms", type=float, default=50.0, help="emulated compute per iteration (ms)")
    parser.add_argument("--slowdown", default="0:3x", help="as hetrain train's (default: rank 0 three times slower)")
    parser.add_argument("--workers", type=int, default=4, help="steady: workers")
    parser.add_argument("--steady-seconds", type=float, default=30.0, help="steady: seconds of training")
    parser.add_argument("--nodes", type=int, default=3, help="churn: nodes holding workers")
    parser.add_argument("--workers-per-node", type=int, default=2)
    parser.add_argument("--spare-per-node", type=int, default=0,
                        help="churn: CPUs each worker node declares beyond its workers' (room for replacements: "
                             "with 1, a lost node's workers are replaced at once on the survivors)")
    parser.add_argument("--seconds", type=float, default=300.0, help="churn: seconds of training")
    parser.add_argument("--period", type=float, default=60.0, help="churn: a node lost every PERIOD s of training")
    parser.add_argument("--back-after", type=float, default=30.0, help="churn: a node added back this long after")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"args": vars(args), "cpus": os.cpu_count()}
    if args.mode in ("steady", "all"):
        record["steady"] = steady(args)
        print(json.dumps(record["steady"], indent=1), flush=True)
    if args.mode in ("churn", "all"):
        record["churn"] = churn(args)
        print(json.dumps(record["churn"], indent=1), flush=True)
    (out / "ray.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out / 'ray.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
