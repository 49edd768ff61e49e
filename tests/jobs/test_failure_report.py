"""The one line a failed job prints names the cause (hetrain.jobs.failure_report)."""

from hetrain.jobs.failure_report import failure_error


def test_a_timed_out_wait_is_named_before_a_lost_connection():
    """A SIGSTOPped worker with heartbeats off: worker 0 waited for it, worker 2 lost its connection to 0.
    The line named worker 2's complaint, which does not name the stopped worker."""
    failures = {
        2: ("worker", "worker 2 lost its connection to worker 0 (another wait on the same group timed out)", None),
        0: ("worker", "worker 0 waited 5 s for updates of iteration 40 from worker(s) [1]", None),
    }
    assert "worker 0 waited 5 s" in str(failure_error({}, failures, None))


def test_a_death_comes_first_and_the_first_report_otherwise():
    failures = {3: ("worker", "worker 3 lost its connection to worker 1", None)}
    assert str(failure_error({1: "was killed by SIGKILL"}, failures, None)).startswith("worker 1 was killed")
    assert str(failure_error({}, failures, None)).startswith("worker 3 failed")


def test_a_send_that_ran_out_its_timeout_is_named_before_a_lost_connection():
    """The same stop seen by a sender: its send to the stopped worker timed out, and a third worker's wait
    on the same group was closed by gloo. The line named the third worker (timing decided which came first)."""
    failures = {
        2: ("worker", "worker 2 lost its connection to worker 0 while waiting for a update header: another wait "
                      "on the same group timed out, and gloo then closes all of its connections", None),
        0: ("worker", "worker 0: a send to worker 1 did not complete within 5 s (did worker 1 exit?): Timed out",
            None),
    }
    assert "a send to worker 1 did not complete" in str(failure_error({}, failures, None))
    first_only = {3: ("worker", "worker 3 failed to build its model", None),
                  1: ("worker", "worker 1 failed to build its model too", None)}
    assert str(failure_error({}, first_only, None)).startswith("worker 3 failed")
