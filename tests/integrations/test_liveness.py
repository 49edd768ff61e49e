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


def _ticks(liveness, start, times):
    for t in times:
        liveness.tick(start + t)


def test_a_stall_of_the_watcher_itself_is_nobodys_silence():
    """The watcher's thread held up 3 s (GC, a C call holding the GIL): the peer's counter has not been
    seen to move, but the gap is the watcher's; only silence after it resumed counts."""
    store = torch.distributed.HashStore()
    store.add("beat/1", 5)
    watcher = StoreLiveness(store, 0, 2, timeout_s=10.0)
    _ticks(watcher, 100.0, [0.0, 0.2, 3.2, 3.4])  # held up between 0.2 and 3.2
    assert watcher.dead_workers() == set()
    _ticks(watcher, 100.0, [3.4 + 0.2 * k for k in range(1, int((SILENCE_S + 0.4) / 0.2))])  # ticking again
    assert watcher.dead_workers() == {1}  # silent for longer than SILENCE_S since the watcher resumed


def test_a_peer_silent_for_less_than_the_silence_is_alive():
    store = torch.distributed.HashStore()
    store.add("beat/1", 5)
    watcher = StoreLiveness(store, 0, 2, timeout_s=10.0)
    times = [0.2 * k for k in range(int(SILENCE_S / 0.2))]  # every 0.2 s for just under SILENCE_S
    _ticks(watcher, 100.0, times)
    assert watcher.dead_workers() == set()


def test_a_death_is_one_membership_and_a_rank_declared_dead_while_alive_leaves():
    from hetrain.errors import WorkerError

    store = torch.distributed.HashStore()
    a, b, c = (StoreLiveness(store, r, 3, timeout_s=10.0) for r in range(3))
    c.tick(100.0)  # rank 2 beats once, then stalls: its counter stays put
    t = 100.0
    while t < 100.0 + SILENCE_S + 0.3:  # ranks 0 and 1 tick on; rank 0 looks at rank 2 first
        a.tick(t)
        if not a.dead_workers():
            b.tick(t)
        t += 0.2
    assert a.dead_workers() == {2} and b.dead_workers() == set()
    b.tick(t)  # rank 1 has not seen the whole silence yet, but adopts rank 0's declaration
    assert b.dead_workers() == {2}
    c.tick(t + 0.2)  # rank 2 resumes: it learns it was declared dead
    with pytest.raises(WorkerError, match="worker 2 was declared dead by worker 0"):
        c.dead_workers()
