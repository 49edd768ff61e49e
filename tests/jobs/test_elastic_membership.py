"""Workers join a running job beyond its first size (``max_workers``, ``--join``) and leave it gracefully
(SIGTERM to one worker, or ``sync.leave()``): docs/decisions/elastic-membership.md.

The workers differ (a straggler, each its own shard), so a model handed on or averaged shows in the
fingerprints; a leave is a SIGTERM from outside, to the worker's pid.
"""

import os
import signal

import pytest
import torch
from process_tree import comm, descendants

from hetrain.config import RunConfig
from hetrain.errors import WorkerError
from hetrain.jobs.local_job import run_local
from hetrain.jobs.run import run_training

GROW = dict(num_workers=2, max_workers=4, join="2@1s", compute_ms=20.0, slowdown="0:2x", timeout_s=20.0)


@pytest.mark.parametrize("protocol, until", [
    pytest.param("hop", dict(iterations=200), marks=pytest.mark.contract),
    ("prague", dict(time_budget_s=8.0)), pytest.param("dpsgd", dict(iterations=200), marks=pytest.mark.slow),
    pytest.param("adpsgd", dict(time_budget_s=8.0), marks=pytest.mark.slow),
    pytest.param("ps", dict(time_budget_s=8.0), marks=pytest.mark.slow),
])
def test_a_job_grows_into_its_vacant_ranks_and_every_member_ends_with_the_final_model(processes, protocol, until):
    metrics = _trained(RunConfig(protocol=protocol, **GROW, **until))
    assert [(j["rank"], j["incarnation"], j["new_member"]) for j in metrics["joins"]] == [(2, 1, True), (3, 1, True)]
    assert metrics["deaths"] == [] and metrics["leaves"] == []
    assert metrics["num_workers"] == 2 and metrics["max_workers"] == 4 and metrics["final_members"] == 4
    workers = {w["rank"]: w for w in metrics["workers"]}
    assert sorted(workers) == [0, 1, 2, 3] and all(w["iterations"] > 0 for w in workers.values())
    assert workers[2]["joined"] and workers[3]["joined"] and not workers[0].get("joined")
    assert all(j["first_step_s"] is not None for j in metrics["joins"])
    if protocol in ("hop", "dpsgd"):  # it took the job's iteration from its neighbours on joining
        assert workers[2]["iteration"] >= 0.5 * workers[1]["iteration"]
    # they mixed while training (no communication: consensus distance near 4) and end with one model
    if protocol != "ps":  # the parameter server's workers hold the server's model after every push
        assert metrics["consensus_distance"] < 1.0
    fingerprints = [w["model_fingerprint"] for w in workers.values()]
    assert all(f == pytest.approx(fingerprints[0], rel=1e-9) for f in fingerprints)
    assert metrics["final_accuracy_avg_model"] > 0.8
    # each epoch's batches were dealt out over the members present, the joiners' from the others' share
    deal = metrics["epochs_dealt"]
    assert deal["epochs_checked"] >= 3 and deal["short"] == deal["over"] == []
    for worker in workers.values():  # every batch dealt was trained on
        assert sum(worker["epochs_dealt"]["batches"]) == worker["iterations"]
    assert workers[2]["epochs_dealt"]["first_epoch"] > 0


def _trained(config: RunConfig, **kwargs) -> dict:
    try:
        return run_training(config, None, progress=False, **kwargs)
    except WorkerError as error:
        raise AssertionError(f"the job failed: {error}") from None


def _sigterm_when_trained(rank: int, computed: int, sent: list):
    """An on_message spy: once ``rank`` has computed ``computed`` gradients, SIGTERM its process from outside
    (found by its name among this test process's descendants)."""
    def spy(reporter, message):
        if reporter == rank and not sent and isinstance(message, dict) and message.get("computed", 0) >= computed:
            pids = [p for p in descendants(os.getpid()) if comm(p).split(".")[0] == f"hetrain-w{rank}"]  # .1: a joiner
            assert len(pids) == 1, pids
            os.kill(pids[0], signal.SIGTERM)
            sent.append(pids[0])
    return spy


def _launch_with(spy):
    def launch(*args, **kwargs):
        own = kwargs["on_message"]

        def both(rank, message):
            spy(rank, message)
            own(rank, message)
        return run_local(*args, **{**kwargs, "on_message": both})
    return launch


@pytest.mark.parametrize("protocol", ["hop", pytest.param("prague", marks=pytest.mark.slow)])
def test_sigterm_to_one_worker_is_a_leave_not_a_death_even_where_a_death_aborts_the_job(processes, protocol):
    sent: list = []
    config = RunConfig(protocol=protocol, num_workers=4, compute_ms=20.0, slowdown="0:2x", timeout_s=20.0,
                       on_failure="abort", iterations=250)
    metrics = _trained(config, launch=_launch_with(_sigterm_when_trained(3, 20, sent)))
    assert sent, "worker 3 never reported 20 gradients"
    assert [x["rank"] for x in metrics["leaves"]] == [3] and metrics["deaths"] == [] and metrics["workers_lost"] == 0
    assert metrics["final_members"] == 3
    workers = {w["rank"]: w for w in metrics["workers"]}
    assert workers[3]["left"] and 20 <= workers[3]["iterations"] < min(workers[r]["iterations"] for r in (1, 2))
    stayed = [workers[r]["model_fingerprint"] for r in (0, 1, 2)]
    assert all(f == pytest.approx(stayed[0], rel=1e-9) for f in stayed)
    assert workers[3]["model_fingerprint"] != pytest.approx(stayed[0], rel=1e-9)  # it left before the average


@pytest.mark.slow
def test_a_rank_a_worker_left_is_joined_again_by_a_join_that_waited_for_it(processes):
    """Room for one more: the first join takes rank 2; the second waits until rank 2's worker has left (SIGTERM
    from outside), then joins into it as the rank's next process, a new member."""
    sent: list = []
    config = RunConfig(protocol="hop", num_workers=2, max_workers=3, join="1@0.5s,1@1s", compute_ms=20.0,
                       slowdown="0:2x", timeout_s=20.0, iterations=300)
    metrics = _trained(config, launch=_launch_with(_sigterm_when_trained(2, 20, sent)))
    assert sent, "worker 2 never reported 20 gradients"
    assert [(j["rank"], j["incarnation"], j["new_member"]) for j in metrics["joins"]] == [(2, 1, True), (2, 2, True)]
    assert [x["rank"] for x in metrics["leaves"]] == [2] and metrics["deaths"] == []
    assert metrics["final_members"] == 3 and metrics["joins_not_started"] == 0
    twos = sorted((w for w in metrics["workers"] if w["rank"] == 2), key=lambda w: w["incarnation"])
    assert [(w["incarnation"], bool(w.get("left")), bool(w.get("joined"))) for w in twos] == [(1, True, True),
                                                                                             (2, False, True)]
    assert twos[1]["iterations"] > 0
    members = [w["model_fingerprint"] for w in metrics["workers"] if not w.get("left")]
    assert len(members) == 3 and all(f == pytest.approx(members[0], rel=1e-9) for f in members)
    deal = metrics["epochs_dealt"]
    assert deal["short"] == deal["over"] == [] and deal["epochs_checked"] >= 3


def _leave_at(ctx, leaver: int, leave_after: int, steps: int):
    """A user's loop: each worker its own data; ``leaver`` calls ``sync.leave()`` after ``leave_after`` steps."""
    import hetrain

    torch.manual_seed(ctx.rank)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    target = torch.full((1,), float(ctx.rank))
    left = False
    with hetrain.Hop(model, optimizer, topology="ring", on_failure="continue", dead_workers=ctx.dead_workers) as sync:
        for step in range(steps):
            loss = (model(torch.randn(16, 8)).mean() - target).pow(2)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if ctx.rank == leaver and step + 1 == leave_after:
                left = sync.leave()
                break
    fingerprint = [float(p.detach().sum()) for p in model.parameters()]
    return {"left": left, "fingerprint": fingerprint}


@pytest.mark.slow
def test_sync_leave_lets_a_worker_of_a_users_loop_go_and_the_others_average_without_it(processes):
    try:
        results = run_local(_leave_at, 4, (1, 30, 300), on_failure="continue", timeout_s=20.0, job_timeout_s=45.0)
    except WorkerError as error:
        raise AssertionError(f"the job failed: {error}") from None
    assert [x["rank"] for x in results.leaves] == [1] and results.deaths == []
    assert results[1]["left"] and not any(results[r]["left"] for r in (0, 2, 3))
    stayed = [results[r]["fingerprint"] for r in (0, 2, 3)]
    assert all(f == pytest.approx(stayed[0], rel=1e-6) for f in stayed)


def test_a_leave_asked_outside_a_launcher_that_tracks_members_says_what_it_needs():
    import hetrain
    from hetrain.errors import UsageError

    with pytest.raises(UsageError, match="needs a hetrain launcher that tracks members"):  # checked first
        hetrain.Hop.leave(_NoLauncher())


class _NoLauncher:
    name = "hop"

    class membership:
        can_leave = False
