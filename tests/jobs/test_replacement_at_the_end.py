"""A replacement admitted as the job ends (``--on-failure respawn``).

Its neighbours looked for joins before it was admitted and finished without sending it a model; it
waited its whole timeout for one while they waited for it in the final average, and the job failed
("worker 1 waited for workers [3] to reach the final average: none made a step for 60 s"; a worker
SIGKILLed 0.2 s before the end of an 8 s run, and 1 of 8 random kills on Ray). Now the first finishing
worker closes the membership before it waits for anyone, and the launcher stops, as it closes, every
replacement that holds no model yet.
"""

import threading
import time
from types import SimpleNamespace

import pytest

from hetrain.config import RunConfig
from hetrain.errors import WorkerError
from hetrain.jobs.context import LauncherMembership
from hetrain.jobs.deaths import Replacements
from hetrain.jobs.local_job import LocalJob
from hetrain.jobs.members import Members
from hetrain.jobs.run import run_training
from hetrain.jobs.start_gate import open_if_ready
from hetrain.runtime import consensus
from hetrain.transport.membership import Membership


class _Processes:
    def __init__(self, n):
        self.killed = []
        self.n = n

    def alive(self, rank):
        return rank not in self.killed

    def pid(self, rank):
        return 1000 + rank

    def kill(self, rank):
        self.killed.append(rank)


def _job_with_two_replacements(settled_ranks):
    """Ranks 1 and 3 were replaced (incarnation 1) and admitted; ``settled_ranks`` said they hold a model."""
    replacements = Replacements()
    for rank in (1, 3):
        replacements.started(rank, 1, 5.0)
        assert replacements.join(rank, 1, 5.5)
    for rank in settled_ranks:
        replacements.settled(rank, 1)
    channels = SimpleNamespace(closing=threading.Event(), dead=[0, 0, 0, 0], incarnations=[0, 1, 0, 1])
    return SimpleNamespace(channels=channels, replacements=replacements, workers=_Processes(4), on_death=None)


def test_closing_the_membership_stops_an_admitted_replacement_that_holds_no_model_yet():
    job = _job_with_two_replacements(settled_ranks=[1])
    LocalJob._close_membership(job)
    assert job.channels.closing.is_set()
    assert job.workers.killed == [3]  # rank 1 holds the job's model: it stays, and counts in the final average
    assert job.channels.dead == [0, 0, 0, 1]  # the finishing workers stop counting 3 as a member
    assert 1000 + 3 in job.replacements.stopped_pids  # its end is no failure of the job
    stopped = [j["rank"] for j in job.replacements.joined if j.get("stopped_before_settling")]
    assert stopped == [3]


def test_a_replacement_that_settled_is_left_alone_and_a_second_close_changes_nothing():
    job = _job_with_two_replacements(settled_ranks=[1, 3])
    LocalJob._close_membership(job)
    LocalJob._close_membership(job)
    assert job.workers.killed == [] and job.channels.dead == [0, 0, 0, 0]


def _launcher(n=6):
    """A LocalJob's membership bookkeeping alone (no processes): what its join and close rules use."""
    job = LocalJob.__new__(LocalJob)
    job.channels = SimpleNamespace(closing=threading.Event(), dead=[0] * n, incarnations=[0] * n,
                                   ready=[1] * n, go=threading.Event())
    job.channels.go.set()  # the job has started: every original ready
    job.replacements, job.workers, job.on_join, job.on_death = Replacements(), _Processes(n), None, None
    job.progress, job.members, job.launched, job.on_members = {}, Members(n, n), time.monotonic(), None
    return job


def _ready(job, rank):
    """``rank`` died and its replacement (incarnation 1) announced it is ready."""
    job.channels.dead[rank], job.channels.incarnations[rank] = 1, 1
    job.replacements.started(rank, 1, 60.0)
    job._joined(rank, 1)


def test_replacements_are_admitted_one_at_a_time_each_once_the_one_before_holds_a_model():
    """Three ranks of a ring lost with one node: two neighbours admitted together each waited for the
    other's model, which neither had ("worker 0 (a replacement) waited 60 s for a model from its
    in-neighbours [1, 5]")."""
    job = _launcher()
    for rank in (0, 1, 5):
        _ready(job, rank)
    assert job.channels.dead == [0, 1, 0, 0, 0, 1]  # 0 admitted; 1 and 5 wait (the others see them dead)
    job.replacements.settled(0, 1)
    job._admit_deferred()
    assert job.channels.dead == [0, 0, 0, 0, 0, 1]
    job.replacements.settled(1, 1)
    job._admit_deferred()
    assert job.channels.dead == [0] * 6
    assert [j["rank"] for j in job.replacements.joined] == [0, 1, 5]


def test_no_replacement_joins_before_every_original_is_ready():
    """A kill during start-up on Ray: the replacement was admitted while a slow original was still
    building its protocol, which took it for an original, waited for its handshake and sent it no model
    ("worker 1 (a replacement) waited 60 s for a model from its in-neighbours [0, 2]")."""
    job = _launcher(4)
    job.channels.go.clear()
    job.channels.ready = [1, 0, 0, 1]  # 1 died before it was ready; 2 is still building its protocol
    _ready(job, 1)
    assert job.channels.dead == [0, 1, 0, 0] and job.replacements.deferred == [(1, 1)]
    job._admit_deferred()
    assert job.channels.dead[1] == 1  # still waiting: the gate is shut
    job.channels.ready[2] = 1
    open_if_ready(job.channels.ready, job.channels.dead, job.channels.go)  # the launcher's watch loop
    job._admit_deferred()
    assert job.channels.dead == [0, 0, 0, 0] and [j["rank"] for j in job.replacements.joined] == [1]


def test_a_protocols_first_step_marks_its_worker_ready_as_the_start_barrier_does():
    """A loop without ``ctx.start_barrier()`` (the barrier is optional in a user's own loop) still
    opens the way for replacements once its protocol has stepped."""
    ready = [0, 0]
    membership = LauncherMembership([0, 0], [0, 0], 1, 0, lambda message: None, lambda timeout: True,
                                    ready_flags=ready)
    membership.note_ready()
    assert ready == [0, 1]


def test_a_replacement_waiting_its_turn_is_stopped_when_the_job_ends():
    job = _launcher()
    _ready(job, 0)
    _ready(job, 1)
    LocalJob._close_membership(job)
    assert sorted(job.workers.killed) == [0, 1]  # 0 admitted with no model, 1 never admitted
    assert job.channels.dead[:2] == [1, 1]


class _Frozen(Exception):
    pass


class _RecordingMembership(Membership):
    def __init__(self):
        self.frozen = False

    def freeze(self, timeout_s):
        self.frozen = True
        return True


def test_the_final_average_closes_the_membership_before_it_waits_for_anyone():
    """Waiting first, a worker waited for an admitted replacement that would never arrive, and nobody
    had closed the membership (the launcher stops such a replacement as it closes)."""
    membership = _RecordingMembership()
    seen = []

    def wait_for_arrivals(dead_workers, what):
        seen.append(membership.frozen)
        raise _Frozen  # what happens after the wait is the final average's collective, not tested here

    job = SimpleNamespace(world_size=4, rank=0, timeout_s=5.0)
    with pytest.raises(_Frozen):
        consensus.average_state(None, job, membership, SimpleNamespace(wait_for_arrivals=wait_for_arrivals))
    assert seen == [True]


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["hop", "prague"])
def test_a_worker_killed_just_before_the_end_is_replaced_or_stopped_and_the_job_ends(processes, protocol):
    """Kills 0.4-0.05 s before the end of the training time: the replacement joins before the end, or is
    stopped as the job ends, or is never started; the job ends well within the timeout every time."""
    killed = 0
    for before_end_s in (0.4, 0.3, 0.2, 0.15, 0.1, 0.05):
        config = RunConfig(protocol=protocol, num_workers=4, compute_ms=20.0, slowdown="0:3x", time_budget_s=4.0,
                           timeout_s=20.0, on_failure="respawn", fail=f"3@{4.0 - before_end_s:.2f}s")
        began = time.monotonic()
        try:
            metrics = run_training(config, None, progress=False)
        except WorkerError as error:
            raise AssertionError(f"killed {before_end_s} s before the end: {error}") from None
        assert time.monotonic() - began < 20.0  # nobody waited out a timeout
        assert metrics["final_accuracy_avg_model"] > 0.8
        killed += metrics["workers_lost"]  # 0 where worker 3 had already finished (a loaded machine)
    assert killed >= 3, killed
