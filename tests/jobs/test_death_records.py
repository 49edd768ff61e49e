"""A death's record times it from the job's start (issue 68, item 8: ``wall_s`` held the raw
``time.monotonic()``, 745.68 in a 20 s run)."""

import time

from hetrain.jobs.deaths import DeathRecords


def test_a_death_s_wall_s_counts_from_the_job_s_start():
    started = time.monotonic()
    records = DeathRecords(started_at=started)
    records.died(2, 0, "SIGKILL", "signal", 0.0, {"iteration": 7, "computed": 7}, 1.5, {0: 7, 1: 6})
    seen_by = time.monotonic() - started
    death = records.public()[0]
    assert 0.0 <= death["wall_s"] <= seen_by, (death["wall_s"], seen_by)
    assert set(death) == {"rank", "incarnation", "how", "cause", "started_t_s", "iteration", "t_s", "wall_s",
                          "computed", "recovery_s"}  # the launcher's own keys stay out of the record
    records.note_recoveries({0: {"computed": 8}, 1: {"computed": 7}}, is_dead=lambda rank: False)
    assert 0.0 <= records.public()[0]["recovery_s"] <= time.monotonic() - started
