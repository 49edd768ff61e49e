"""What a failed send says: a send that fails at once is not reported as a timeout."""

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
