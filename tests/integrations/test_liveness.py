"""StoreLiveness: a rank whose heartbeat stops is reported dead once, to a callback set before or after."""

import time

import pytest

torch = pytest.importorskip("torch")

from hetrain.integrations.liveness import SILENCE_S, StoreLiveness  # noqa: E402


def wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_silent_rank_is_dead_and_a_late_callback_hears_of_it_once_and_may_fail():
    store = torch.distributed.HashStore()
    store.add("beat/1", 1)  # rank 1 beat once, then fell silent
    liveness = StoreLiveness.start(store, 0, 3, timeout_s=10.0)
    try:
        wait_for(lambda: liveness.dead_workers() == {1})
        heard = []

        def on_death(rank):
            heard.append(rank)
            raise RuntimeError("a failing callback must not stop the heartbeat")

        liveness.notify(on_death)  # set after the death: replayed at once
        assert heard == [1]
        beats = store.add("beat/0", 0)
        store.add("beat/2", 1)  # rank 2 starts beating, then stops: heard through the callback
        wait_for(lambda: heard == [1, 2])
        assert store.add("beat/0", 0) > beats  # this rank still beats
        assert liveness.dead_workers() == {1, 2}
    finally:
        liveness.stop()


def test_a_rank_that_never_beat_is_not_dead():
    liveness = StoreLiveness.start(torch.distributed.HashStore(), 0, 2, timeout_s=10.0)
    try:
        time.sleep(SILENCE_S + 0.5)
        assert liveness.dead_workers() == set()
    finally:
        liveness.stop()
