"""The launcher's record of who finished and whom each told (hetrain.jobs.context.LauncherMembership):
a survivor must not wait for a neighbour that finished before a repair made them neighbours, and
must still wait for the STOP of one that did tell it (its last updates may be on the way)."""

from hetrain.jobs.context import LauncherMembership


def _membership(rank, dead, finished, stops):
    return LauncherMembership(dead, [0] * len(dead), rank, 0, report=lambda message: None,
                              wait_frozen=lambda timeout_s: True, finished_flags=finished, stop_flags=stops)


def test_a_neighbour_that_finished_without_telling_this_worker_is_reported():
    n = 4
    dead, finished, stops = [0] * n, [0] * n, [0] * (n * n)
    worker0 = _membership(0, dead, finished, stops)
    worker0.record_finish(update_stops=[1], token_stops=[3])  # its neighbours before worker 2 died
    dead[2] = 1
    assert _membership(3, dead, finished, stops).finished_without_stop() == ({0}, set())  # a token STOP came
    assert _membership(1, dead, finished, stops).finished_without_stop() == (set(), {0})  # an update STOP came
    assert worker0.finished_without_stop() == (set(), set())  # not itself
    dead[0] = 1  # dead: the death is repaired around instead
    assert _membership(3, dead, finished, stops).finished_without_stop() == (set(), set())


def test_nobody_has_finished_until_the_record_is_made():
    dead, finished, stops = [0] * 3, [0] * 3, [0] * 9
    assert _membership(1, dead, finished, stops).finished_without_stop() == (set(), set())
    assert _membership(1, dead, None, None).finished_without_stop() == (set(), set())  # no launcher record
