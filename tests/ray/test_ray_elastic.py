"""A Ray job grows onto a node added to the cluster, and its workers leave a node being drained
(docs/decisions/ray-jobs-grow-and-drain.md).

The issue's Ray goal at a small size: a cluster whose one node (the driver's) has room for 2 workers,
``--workers 2 --max-workers 4`` (hop, rank 0 twice as slow, each rank its own share of the data); once
training has begun, a node of 2 CPUs is added: the job's 2 vacant ranks start on it and join, one after
the other. Once both
have trained, the node is drained (the cluster's control store, as ``ray drain-node``): its workers leave
the job (``leaves``, not ``deaths``) and then the node is removed at once, as whoever drained it may (the
leavers' results may be lost with it: still leaves); the others train to the end and hold one model.
Then another node is added: the ranks that were left wait for room again, and the job grows back.
"""

import dataclasses
import os
import signal

import pytest

pytest.importorskip("ray", reason="the Ray launcher's tests need hetrain[ray]")

import ray  # noqa: E402
import ray_probe  # noqa: E402 (on the actors' PYTHONPATH too: tests/ray/conftest.py)
from ray_nodes import node_args  # noqa: E402 (tests/ray is on sys.path)

import hetrain.ray  # noqa: E402
from hetrain.config import RunConfig  # noqa: E402
from hetrain.data import load_dataset  # noqa: E402
from hetrain.errors import WorkerError  # noqa: E402
from hetrain.jobs.run import run_training  # noqa: E402

GROW = RunConfig(protocol="hop", num_workers=2, max_workers=4, compute_ms=20.0, slowdown="0:2x", time_budget_s=45.0,
                 timeout_s=30.0, heartbeat_timeout_s=30.0)  # time for two cold joins in a row on a loaded machine
TRAINED = 20  # gradients each joined worker computes before its node is drained


class NodeComesAndGoes:
    """On the driver's thread (each progress report and membership line): adds a node once training has
    begun, drains it once the workers that joined onto it have trained, removes it once they have left."""

    def __init__(self, cluster, drain: bool):
        self.cluster, self.drain = cluster, drain
        self.added = self.readded = None
        self.lines: list[str] = []
        self.computed: dict[int, int] = {}
        self.drained = self.removed = False

    def on_message(self, rank: int, message) -> None:
        if not isinstance(message, dict) or "computed" not in message:
            return
        self.computed[rank] = message["computed"]
        if self.added is None and message["computed"] > 0:
            self.added = self.cluster.add_node(**node_args(2))  # Ray's harness: from the main thread only
        if self.removed and self.readded is None:  # room again, for the ranks that were left
            self.readded = self.cluster.add_node(**node_args(2))
        joined = [r for r in (2, 3) if f"worker {r} joined" in " ".join(self.lines)]
        if (self.drain and not self.drained and len(joined) == 2
                and all(self.computed.get(r, 0) >= TRAINED for r in joined)):
            drain_node(self.added.node_id)
            self.drained = True

    def on_members(self, line: str) -> None:
        self.lines.append(line)
        if self.drained and not self.removed and sum("leaves the job (" in x for x in self.lines) == 2:
            self.cluster.remove_node(self.added)  # they have left: whoever drained the node ends it
            self.removed = True


def drain_node(node_id: str) -> None:
    """Drain a node as ``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION`` does (a minute's deadline)."""
    import time

    from ray.core.generated import autoscaler_pb2

    client = ray._private.worker.global_worker.gcs_client
    accepted, why = client.drain_node(node_id, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
                                      "hetrain test", int(time.time() * 1000) + 60_000)
    assert accepted, why


def _launch_watched(events: NodeComesAndGoes):
    from hetrain.ray.actors import RayPlacement
    from hetrain.ray.connection import actor_env
    from hetrain.ray.job import run_ray

    placement = RayPlacement({"CPU": 1.0}, "127.0.0.1", actor_env("127.0.0.1"))

    def launch(*args, **kwargs):
        own_message, own_members = kwargs["on_message"], kwargs["on_members"]

        def on_message(rank, message):
            events.on_message(rank, message)
            own_message(rank, message)

        def on_members(line):
            events.on_members(line)
            own_members(line)
        return run_ray(*args, placement=placement, **{**kwargs, "on_message": on_message, "on_members": on_members})
    return launch


def _trained(config: RunConfig, events: NodeComesAndGoes) -> dict:
    try:
        return run_training(config, None, progress=False, launch=_launch_watched(events), service_host="127.0.0.1")
    except WorkerError as error:
        raise AssertionError(f"the job failed: {error}; membership lines: {events.lines}") from None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_ray_job_grows_onto_an_added_node_its_workers_leave_when_it_is_drained_and_it_grows_back(processes,
                                                                                                 joined):
    cluster = joined(2)  # the driver's node: room for the 2 starting workers, none for more
    events = NodeComesAndGoes(cluster, drain=True)
    metrics = _trained(dataclasses.replace(GROW, time_budget_s=75.0), events)  # time for 4 cold joins
    assert events.added is not None and events.drained and events.removed, events.lines
    # grown: the vacant ranks started on the added node once it came, and joined
    joins = [(j["rank"], j["incarnation"], j["new_member"]) for j in metrics["joins"]]
    assert sorted(joins[:2]) == [(2, 1, True), (3, 1, True)], events.lines
    placed = metrics["ray_placements"]
    assert {placed[f"{r}.1"]["node"] for r in (2, 3)} == {events.added.node_id}
    assert {placed[f"{r}.0"]["node"] for r in (0, 1)} == {cluster.head_node.node_id}
    # drained: its workers left gracefully; no one died, though the node was removed after
    assert sorted(x["rank"] for x in metrics["leaves"]) == [2, 3] and metrics["deaths"] == [], metrics["deaths"]
    assert not metrics.get("interrupted")
    # grown back: the ranks left waited for room again, and joined the node added after (their next process)
    assert events.readded is not None and joins[2:] == [(2, 2, True), (3, 2, True)], events.lines
    assert {placed[f"{r}.2"]["node"] for r in (2, 3)} == {events.readded.node_id}
    assert metrics["final_members"] == 4
    members = [w for w in metrics["workers"] if not w.get("left")]
    assert sorted((w["rank"], w["incarnation"]) for w in members) == [(0, 0), (1, 0), (2, 2), (3, 2)]
    fingerprints = [w["model_fingerprint"] for w in members]
    assert all(f == pytest.approx(fingerprints[0], rel=1e-9) for f in fingerprints)
    assert all(w["loop_s"] >= 75.0 for w in members if w["rank"] < 2)
    assert metrics["final_accuracy_avg_model"] > 0.8


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_ray_job_that_grew_ends_with_every_member_holding_one_model(processes, joined):
    cluster = joined(2)
    events = NodeComesAndGoes(cluster, drain=False)
    metrics = _trained(GROW, events)
    assert [(j["rank"], j["new_member"]) for j in metrics["joins"]] == [(2, True), (3, True)], events.lines
    assert metrics["deaths"] == [] and metrics["leaves"] == [] and metrics["final_members"] == 4
    workers = {w["rank"]: w for w in metrics["workers"]}
    assert sorted(workers) == [0, 1, 2, 3] and all(w["iterations"] > 0 for w in workers.values())
    assert metrics["consensus_distance"] < 1.0  # they mixed while training (no communication: near 4)
    fingerprints = [w["model_fingerprint"] for w in workers.values()]
    assert all(f == pytest.approx(fingerprints[0], rel=1e-9) for f in fingerprints)
    # one at a time: the second started once the first had joined
    starts = [line.split(" starts")[0] for line in events.lines if "starts and joins" in line]
    assert starts == ["worker 2", "worker 3"], events.lines
    assert events.lines.index(next(x for x in events.lines if x.startswith("worker 2 joined"))) < \
        events.lines.index(next(x for x in events.lines if x.startswith("worker 3 starts"))), events.lines


class SigtermWhenTrained:
    """SIGTERMs ``rank``'s actor process (its pid from its first report) once it has computed ``computed``."""

    def __init__(self, rank: int, computed: int):
        self.rank, self.computed = rank, computed
        self.pid = None
        self.sent = False

    def __call__(self, rank: int, message: dict) -> None:
        if rank == self.rank and "pid" in message:
            self.pid = message["pid"]
        if rank == self.rank and not self.sent and message.get("computed", 0) >= self.computed:
            os.kill(self.pid, signal.SIGTERM)
            self.sent = True


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigterm_to_a_ray_workers_process_is_a_leave_not_a_death(processes, joined):
    """As to a local worker's: Ray's own handler (the actor exits) is replaced as the actor is built."""
    joined(3)
    config = RunConfig(protocol="hop", num_workers=3, compute_ms=20.0, slowdown="0:2x", time_budget_s=12.0,
                       timeout_s=30.0)
    spy = SigtermWhenTrained(2, TRAINED)
    results = hetrain.ray.run(ray_probe.train_reporting_node, 3, on_failure="continue", on_message=spy,
                              args=(config, {}, load_dataset("digits")), timeout_s=config.timeout_s)
    assert spy.sent, "worker 2 never reported its gradients"
    assert [x["rank"] for x in results.leaves] == [2] and results.deaths == [], results.deaths
    assert results[2]["worker"]["left"] and not results[0]["worker"].get("left")
    stayed = [results[r]["worker"]["model_fingerprint"] for r in (0, 1)]
    assert stayed[0] == pytest.approx(stayed[1], rel=1e-9)
    assert results[2]["worker"]["model_fingerprint"] != pytest.approx(stayed[0], rel=1e-9)  # left before the average


def test_a_ray_job_asked_to_shrink_below_its_start_is_refused_before_the_cluster_is_joined(monkeypatch):
    import hetrain.ray
    from hetrain.ray import connection

    def joined(address):
        raise AssertionError("the cluster was joined before the arguments were checked")

    monkeypatch.setattr(connection, "connect", joined)
    with pytest.raises(ValueError, match=r"max_workers \(1\) must be at least the starting workers \(2\)"):
        hetrain.ray.run(print, 2, max_workers=1)
    with pytest.raises(ValueError, match="joins add 3 workers to a job of 2 that cannot grow: give max_workers"):
        hetrain.ray.run(print, 2, joins=[(1.0, 3)])
