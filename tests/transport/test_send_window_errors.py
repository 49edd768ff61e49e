"""What a failed send says: a send that fails at once is not reported as a timeout."""

import threading
import time

import pytest

from hetrain.errors import WorkerError
from hetrain.transport.send_window import SendWindow


class _Failing:
    def __init__(self, message):
        self.message = message

    def wait(self, timeout):
        raise RuntimeError(self.message)


def test_a_send_that_fails_at_once_says_so_not_that_it_timed_out():
    window = SendWindow("worker 0", peer=1, timeout_s=60)
    try:
        window.post(lambda: [_Failing("Connection closed by peer [127.0.0.1]:1234")])
        with pytest.raises(WorkerError) as failure:
            window.drain(timeout_s=5)
    finally:
        window.close()
    message = str(failure.value)
    assert "worker 0: a send to worker 1 failed after" in message and "Connection closed by peer" in message
    assert "within 60 s" not in message


class _Never:
    def wait(self, timeout):  # a peer that stopped receiving: gloo waits out its timeout
        time.sleep(min(timeout.total_seconds(), 3))
        raise RuntimeError("Timed out waiting")


def test_a_closed_window_wakes_a_blocked_post_and_refuses_new_ones():
    """close() (its peer forgotten from another thread) left a post blocked on a full window for its whole
    timeout, then blamed the peer; a post after close() was queued where no reaper would ever serve it."""
    window = SendWindow("worker 0", peer=1, max_in_flight=1, timeout_s=30)
    window.post(lambda: [_Never()])
    threading.Timer(0.2, window.close).start()
    began = time.monotonic()
    with pytest.raises(WorkerError, match="window to worker 1 is closed"):
        window.post(lambda: [_Never()])
    assert time.monotonic() - began < 5
    with pytest.raises(WorkerError, match="is closed"):
        window.post(lambda: [_Never()])
