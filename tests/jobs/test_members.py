"""The launcher's record of vacant ranks, joins and graceful leaves (hetrain.jobs.members)."""

import time

from hetrain.jobs.members import LEAVE_GRACE_S, Members


def test_joins_fill_the_lowest_vacant_ranks_when_their_time_comes():
    members = Members(6, 2, joins=[(8.0, 3), (2.0, 1)])
    assert members.vacant == [2, 3, 4, 5]
    assert members.due(None) == []  # training has not begun
    assert members.due(1.9) == []
    assert members.due(2.0) == [2]
    assert members.due(9.0) == [3, 4, 5]
    assert members.vacant == [] and members.joined == {2, 3, 4, 5}
    assert members.due(100.0) == []


def test_more_joins_than_vacant_ranks_start_what_fits():
    members = Members(3, 2, joins=[(1.0, 5)])
    assert members.due(1.0) == [2]


def test_a_leave_is_granted_only_after_the_grace_and_is_recorded_once():
    members = Members(4, 4)
    members.wants_to_leave(3, 0)
    members.wants_to_leave(3, 0)  # asked twice: one ask
    assert members.ripe() == []  # a SIGTERM to the whole job reaches the launcher within the grace
    time.sleep(LEAVE_GRACE_S + 0.05)
    assert members.ripe() == [(3, 0)]
    assert members.ripe() == []
    members.let_go(3, 0, training_time_s=4.25, last_report={"iteration": 40})
    assert members.is_leaving(3, 0) and not members.is_leaving(3, 1)
    assert [(x["rank"], x["t_s"], x["iteration"]) for x in members.left] == [(3, 4.25, 40)]


def test_the_members_count_reads_the_dead_flags():
    members = Members(4, 2)
    assert members.count([0, 0, 1, 1]) == 2
