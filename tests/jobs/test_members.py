"""The launcher's record of vacant ranks, joins and graceful leaves (hetrain.jobs.members)."""

import types

import hetrain.jobs.members as members_module
from hetrain.jobs.members import LEAVE_GRACE_S, Members


def test_joins_fill_the_lowest_vacant_ranks_when_their_time_comes():
    members = Members(6, 2, joins=[(8.0, 3), (2.0, 1)])
    assert members.vacant == [2, 3, 4, 5]
    assert members.due(None) == []  # training has not begun
    assert members.due(1.9) == []
    assert members.due(2.0) == [2]
    assert members.due(9.0) == [3, 4, 5]
    assert members.vacant == [] and members.fresh == {2, 3, 4, 5}
    assert members.due(100.0) == []
    assert members.starting(3) and not members.starting(3)  # a new member once; a later process replaces it


def test_joins_beyond_the_vacant_ranks_wait_and_take_the_rank_of_a_worker_that_left():
    members = Members(3, 2, joins=[(1.0, 2), (5.0, 1)])
    assert members.due(1.0) == [2]
    assert members.waiting(1.0) == 1 and members.waiting(5.0) == 2
    assert members.due(6.0) == []  # every rank has a worker
    members.let_go(0, 0, training_time_s=6.5, last_report={})
    members.vacate(0)  # its worker has ended
    assert members.vacant == [0]
    assert members.due(7.0) == [0] and members.waiting(7.0) == 1
    assert members.starting(0)  # the worker joining a rank that was left is a new member


def test_a_leave_is_granted_only_after_the_grace_and_is_recorded_once(monkeypatch):
    now = [100.0]  # a fake clock: the grace does not hang on the test's own scheduling
    monkeypatch.setattr(members_module, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    members = Members(4, 4)
    members.wants_to_leave(3, 0)
    members.wants_to_leave(3, 0)  # asked twice: one ask
    now[0] += 0.9 * LEAVE_GRACE_S
    assert members.ripe() == []  # a SIGTERM to the whole job reaches the launcher within the grace
    now[0] += 0.2 * LEAVE_GRACE_S
    assert members.ripe() == [(3, 0)]
    assert members.ripe() == []
    members.let_go(3, 0, training_time_s=4.25, last_report={"iteration": 40})
    assert members.is_leaving(3, 0) and not members.is_leaving(3, 1)
    assert [(x["rank"], x["t_s"], x["iteration"]) for x in members.left] == [(3, 4.25, 40)]


def test_the_members_count_reads_the_dead_flags():
    members = Members(4, 2)
    assert members.count([0, 0, 1, 1]) == 2
