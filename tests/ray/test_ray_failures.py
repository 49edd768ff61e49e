"""A Ray job loses a whole node mid-run: the survivors go on (``continue``), and with ``respawn`` the lost
workers' replacements start on a node added afterwards and join.

Ray's multi-node harness on this machine: a head node with no CPU for workers (the driver's: it must
outlive the job) and two nodes of 2 CPUs, so 4 workers are spread 2 + 2. Once every worker has trained
for a while, the node holding ranks ... is removed (``Cluster.remove_node``: its raylet and every actor on
it die). Each rank samples its own part of the data, so only communication makes their models agree.
"""

import dataclasses
import time

import pytest

pytest.importorskip("ray", reason="the Ray launcher's tests need hetrain[ray]")

import ray_probe  # noqa: E402 (on the actors' PYTHONPATH too: tests/ray/conftest.py)

import hetrain.ray  # noqa: E402
from hetrain.config import RunConfig  # noqa: E402
from hetrain.data import load_dataset  # noqa: E402

CONFIG = RunConfig(protocol="hop", num_workers=4, compute_ms=20.0, time_budget_s=20.0, timeout_s=30.0)


class NodeLoss:
    """Watches the workers' reports (on the driver's thread); once each has trained ``after_s``, removes the
    node of rank 0 (not the head), then (``add_cpus``) adds a fresh node at the first report a second later
    (Ray's harness starts nodes from the main thread only)."""

    def __init__(self, cluster, after_s: float, add_cpus: int = 0):
        self.cluster, self.after_s, self.add_cpus = cluster, after_s, add_cpus
        self.node_of: dict[int, str] = {}
        self.t_s: dict[int, float] = {}
        self.lost_ranks: list[int] = []
        self.removed_at: float | None = None
        self.added = None

    def __call__(self, rank: int, message: dict) -> None:
        if "node" in message:
            self.node_of.setdefault(rank, message["node"])
        if "t_s" in message:
            self.t_s[rank] = message["t_s"]
        if self.removed_at is None and len(self.t_s) == CONFIG.num_workers and min(self.t_s.values()) >= self.after_s:
            victim = next(n for n in self.cluster.worker_nodes if n.node_id == self.node_of[0])
            self.lost_ranks = sorted(r for r, node in self.node_of.items() if node == victim.node_id)
            self.cluster.remove_node(victim)
            self.removed_at = time.monotonic()
        elif self.add_cpus and self.added is None and self.removed_at and time.monotonic() > self.removed_at + 1:
            from ray_nodes import node_args

            self.added = self.cluster.add_node(**node_args(self.add_cpus))


def _assert_consensus(survivors: list[dict]) -> None:
    # the final average reached every live worker: they hold one model
    first = survivors[0]["worker"]["model_fingerprint"]
    assert all(r["worker"]["model_fingerprint"] == pytest.approx(first, rel=1e-9) for r in survivors)
    # they mixed while training: their models lay close as the loop ended (a run with no communication,
    # HETRAIN_MUTANT=no-comm, leaves them ~4 apart: tests/jobs/test_respawn.py)
    assert survivors[0]["worker"]["consensus_distance"] < 1.0
    scored = [r["worker"]["consensus_accuracy"] for r in survivors if r["worker"]["consensus_accuracy"] is not None]
    assert len(scored) == 1 and scored[0] > 0.8  # one evaluation of the one final model


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_lost_node_leaves_the_survivors_training_to_consensus(processes, joined):
    cluster = joined(0, 2, 2)
    loss = NodeLoss(cluster, after_s=2.0)
    results = hetrain.ray.run(ray_probe.train_reporting_node, 4, on_failure="continue",
                              args=(CONFIG, {}, load_dataset("digits")), timeout_s=CONFIG.timeout_s,
                              on_message=loss)
    assert len(loss.lost_ranks) == 2, loss.node_of  # spread 2 + 2: the node held two workers
    assert [r is None for r in results] == [rank in loss.lost_ranks for rank in range(4)]
    assert sorted(d["rank"] for d in results.deaths) == loss.lost_ranks
    assert all("node" in d["how"] for d in results.deaths), results.deaths
    survivors = [r for r in results if r is not None]
    _assert_consensus(survivors)
    assert all(r["worker"]["loop_s"] >= CONFIG.time_budget_s for r in survivors)  # trained to the end


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_respawn_starts_the_lost_workers_on_a_node_added_afterwards(processes, joined):
    """The replacements start cold on the new node (a Ray worker process importing torch and hetrain):
    seconds on an idle machine, more than the 18 s left of a 20 s budget with the two cores loaded
    (1 of 2 joined beside the respawn sweep), hence a longer one."""
    cluster = joined(0, 2, 2)
    loss = NodeLoss(cluster, after_s=2.0, add_cpus=2)
    config = dataclasses.replace(CONFIG, time_budget_s=40.0)
    results = hetrain.ray.run(ray_probe.train_reporting_node, 4, on_failure="respawn",
                              args=(config, {}, load_dataset("digits")), timeout_s=CONFIG.timeout_s,
                              on_message=loss)
    assert len(loss.lost_ranks) == 2
    assert sorted((j["rank"], j["incarnation"]) for j in results.joins) == [(r, 1) for r in loss.lost_ranks]
    assert all(r is not None for r in results)  # every rank has a live worker at the end
    placed = results.launcher["ray_placements"]
    assert {placed[f"{r}.1"]["node"] for r in loss.lost_ranks} == {loss.added.node_id}  # on the new node
    _assert_consensus(list(results))
    assert all(results[r]["worker"]["incarnation"] == 1 and results[r]["worker"]["iterations"] > 0
               for r in loss.lost_ranks)
