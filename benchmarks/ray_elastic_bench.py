"""Ray benchmark of issue 71's Ray goal: a job grows onto a node added to the cluster, then leaves it as it is drained.

    .venv/bin/python benchmarks/ray_elastic_bench.py --out runs/ray-elastic     # as docs/results/2026-12-07-ray-elastic.md

The cluster is Ray's own multi-node harness (``ray.cluster_utils.Cluster``) on this machine, every node on
loopback (``node_ip_address=127.0.0.1``, ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``), no dashboard. Its one
node (the head, the driver's) declares ``--head-cpus`` CPUs: room for the 2 starting workers, none more.

The job is the command a user runs, in a subprocess: ``hetrain train --launcher ray --ray-address ADDRESS
--workers 2 --max-workers 4`` (``--protocol``, ``--compute-ms``, ``--slowdown``, ``--seconds`` of training),
its progress bar and membership lines read from its stderr as they come, each stamped on arrival. Once the
bar shows the first gradients (training has begun), this script:

* ``--add-after`` s later, adds a node of ``--node-cpus`` CPUs (``Cluster.add_node``);
* ``--drain-after`` s after the start of training (0: never), drains that node as an operator or the autoscaler would
  (``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION --deadline-remaining-seconds D``, the command
  itself), and removes it (``Cluster.remove_node``) once that deadline has passed, as the provider would.

Figures:

* ``join_s``: the node added (the call to ``add_node``; ``add_node_s``: how long the harness took to start
  the node's raylet and return) -> the job's line "worker R joined" (admitted: it trains and its neighbours
  talk to it); ``placed_s``: -> "worker R starts and joins" (its placement group placed); ``first_step_s``
  from the record (the joined worker's start -> its first step);
* ``leave_s``: the drain accepted (``ray drain-node`` returned) -> "worker R leaves the job";
* the exit code, ``metrics.json``'s ``joins``, ``leaves``, ``deaths``, ``final_members``, whether the
  members at the end hold one model (their ``model_fingerprint``s), the final accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read as Ray is imported: loopback stays loopback

OBJECT_STORE_BYTES = 80 * 2**20
_GRADIENTS = re.compile(r"(\d+) gradients")
_JOINED = re.compile(r"hetrain: worker (\d+) joined")
_PLACED = re.compile(r"hetrain: worker (\d+) starts and joins")
_LEFT = re.compile(r"hetrain: worker (\d+) leaves the job")


def node_args(num_cpus: int, **extra) -> dict:
    return dict(node_ip_address="127.0.0.1", num_cpus=num_cpus, object_store_memory=OBJECT_STORE_BYTES, **extra)


class StampedLines:
    """The lines of a stream (split on newlines and the bar's carriage returns), each with its arrival time."""

    def __init__(self, stream):
        self.lines: list[tuple[float, str]] = []
        self._stream = stream
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        pending = b""
        while chunk := os.read(self._stream.fileno(), 65536):
            pending += chunk
            *whole, pending = re.split(rb"[\r\n]", pending)
            now = time.monotonic()
            self.lines.extend((now, line.decode(errors="replace")) for line in whole if line.strip())

    def first(self, pattern: re.Pattern, after: float = 0.0, where=lambda match: True) -> float | None:
        return next((t for t, line in list(self.lines) if t >= after and (m := pattern.search(line)) and where(m)),
                    None)

    def by_rank(self, pattern: re.Pattern) -> dict[int, float]:
        found: dict[int, float] = {}
        for t, line in list(self.lines):
            if (match := pattern.search(line)) is not None:
                found.setdefault(int(match.group(1)), t)
        return found

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)


def drain(address: str, node_id: str, deadline_s: int) -> None:
    """``ray drain-node``, the command (an operator's, or what the autoscaler asks the cluster through its API)."""
    ray_cli = Path(sys.executable).with_name("ray")
    subprocess.run([str(ray_cli), "drain-node", "--address", address, "--node-id", node_id,
                    "--reason", "DRAIN_NODE_REASON_PREEMPTION", "--reason-message", "ray_elastic_bench",
                    "--deadline-remaining-seconds", str(deadline_s)], check=True, capture_output=True, timeout=120)


def run(args) -> dict:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args=node_args(args.head_cpus, include_dashboard=False))
    out = Path(args.out) / "job"
    command = [sys.executable, "-m", "hetrain", "train", "--launcher", "ray", "--ray-address", cluster.address,
               "--workers", str(args.workers), "--max-workers", str(args.max_workers), "--protocol", args.protocol,
               "--compute-ms", str(args.compute_ms), "--slowdown", args.slowdown, "--time-budget", str(args.seconds),
               "--out", str(out)]
    events: dict = {"added_at": None, "drained_at": None, "removed_at": None, "began": time.monotonic()}
    try:
        began = events["began"]
        job = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        lines = StampedLines(job.stderr)
        added = None
        while job.poll() is None:
            time.sleep(0.1)
            trained_from = lines.first(_GRADIENTS, where=lambda m: int(m.group(1)) > 0)
            if trained_from is None:
                continue
            now = time.monotonic()
            if added is None and now >= trained_from + args.add_after:
                events["adding_at"] = now
                added = cluster.add_node(**node_args(args.node_cpus))
                events["added_at"] = time.monotonic()
            elif (added is not None and args.drain_after and events["drained_at"] is None
                  and now >= trained_from + args.drain_after):
                drain(cluster.address, added.node_id, args.drain_deadline)
                events["drained_at"] = time.monotonic()
            elif events["drained_at"] is not None and events["removed_at"] is None \
                    and now >= events["drained_at"] + args.drain_deadline:
                cluster.remove_node(added)
                events["removed_at"] = time.monotonic()
        whole_s = time.monotonic() - began
        lines.join(10)
    finally:
        cluster.shutdown()
    return figures(args, job.returncode, lines, events, out, whole_s, trained_from)


def figures(args, code: int, lines: StampedLines, events: dict, out: Path, whole_s: float, trained_from) -> dict:
    def since(moment, table):
        return {rank: round(t - moment, 2) for rank, t in sorted(table.items())} if moment is not None else {}

    row = {"exit_code": code, "whole_s": round(whole_s, 1),
           "node_added_s_into_training": round(events["adding_at"] - trained_from, 2) if events["added_at"] else None,
           "add_node_s": round(events["added_at"] - events["adding_at"], 2) if events["added_at"] else None,
           "drained_s_into_training": round(events["drained_at"] - trained_from, 2) if events["drained_at"] else None,
           "node_removed": events["removed_at"] is not None,
           "placed_s": since(events.get("adding_at"), lines.by_rank(_PLACED)),
           "join_s": since(events.get("adding_at"), lines.by_rank(_JOINED)),
           "leave_s": since(events["drained_at"], lines.by_rank(_LEFT)),
           "membership_lines": [line for _, line in lines.lines if line.startswith("hetrain:")]}
    (out.parent / "job_stderr.txt").write_text("".join(f"{t - events['began']:8.2f} {line}\n" for t, line in lines.lines))
    metrics_path = out / "metrics.json"
    if metrics_path.exists():
        metrics = json.loads(metrics_path.read_text())
        members = [w for w in metrics["workers"] if not w.get("left")]
        prints = [w["model_fingerprint"] for w in members]
        row.update(joins=metrics["joins"], leaves=metrics["leaves"], deaths=metrics["deaths"],
                   final_members=metrics["final_members"], member_ranks=[w["rank"] for w in members],
                   models_equal=bool(prints) and all(same_model(p, prints[0]) for p in prints),
                   first_step_s={j["rank"]: j.get("first_step_s") for j in metrics["joins"]},
                   final_accuracy=metrics["final_accuracy_avg_model"], samples_per_s=metrics["samples_per_s"],
                   ray_placements=metrics.get("ray_placements"))
    return row


def same_model(a: list[float], b: list[float]) -> bool:
    """Two ``model_fingerprint``s equal to 1e-9 relative (the tests' tolerance)."""
    return len(a) == len(b) and all(abs(x - y) <= 1e-9 * max(1.0, abs(y)) for x, y in zip(a, b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--protocol", default="hop")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-workers", type=int, default=4)
    parser.add_argument("--head-cpus", type=int, default=2, help="room for the starting workers, none more")
    parser.add_argument("--node-cpus", type=int, default=2)
    parser.add_argument("--compute-ms", type=float, default=50.0)
    parser.add_argument("--slowdown", default="0:3x")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--add-after", type=float, default=10.0)
    parser.add_argument("--drain-after", type=float, default=25.0, help="0: the node is never drained")
    parser.add_argument("--drain-deadline", type=int, default=8)
    args = parser.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    row = run(args)
    row["settings"] = vars(args)
    (Path(args.out) / "ray_elastic.json").write_text(json.dumps(row, indent=2))
    print(json.dumps({k: v for k, v in row.items() if k not in ("ray_placements", "joins", "leaves")}, indent=2))


if __name__ == "__main__":
    main()
