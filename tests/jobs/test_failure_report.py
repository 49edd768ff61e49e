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
