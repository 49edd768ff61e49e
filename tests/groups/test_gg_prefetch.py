"""GroupPrefetch: the request leaves at its time (or at take), its groups are owed, errors reach the worker."""

from __future__ import annotations

import threading
import time

import pytest

from hetrain.errors import WorkerError
from hetrain.groups.gg_prefetch import GroupPrefetch
from hetrain.protocols.request_timing import ComputeEstimate, ask_after_s


class FakeGG:
    def __init__(self, answers=None, block: threading.Event | None = None, error: Exception | None = None):
        self.calls: list[float] = []
        self.answers = list(answers or [])
        self.block, self.error = block, error

    def request(self):
        self.calls.append(time.perf_counter())
        if self.block is not None:
            self.block.wait()
        if self.error is not None:
            raise self.error
        return self.answers.pop(0) if self.answers else []


def _wait_for(condition, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_request_is_sent_at_its_time_and_taken_without_a_second_round_trip():
    gg = FakeGG(answers=[["g1"]])
    prefetch = GroupPrefetch(gg.request, "worker 3", timeout_s=5)
    try:
        at = time.perf_counter() + 0.05
        prefetch.schedule(at)
        _wait_for(lambda: gg.calls)
        assert gg.calls[0] >= at
        assert prefetch.take() == ["g1"]
        assert prefetch.sent_early == 1 and len(gg.calls) == 1 and not prefetch.pending
    finally:
        prefetch.close()


def test_take_before_the_planned_time_asks_at_once():
    gg = FakeGG(answers=[["g1"]])
    prefetch = GroupPrefetch(gg.request, "worker 3", timeout_s=5)
    try:
        prefetch.schedule(time.perf_counter() + 60)
        began = time.perf_counter()
        assert prefetch.take() == ["g1"]
        assert time.perf_counter() - began < 5
        assert prefetch.sent_early == 0
    finally:
        prefetch.close()


def test_withdraw_cancels_an_unsent_request_and_returns_a_sent_ones_groups():
    gg = FakeGG(answers=[["owed"]])
    prefetch = GroupPrefetch(gg.request, "worker 1", timeout_s=5)
    try:
        prefetch.schedule(time.perf_counter() + 60)
        assert prefetch.withdraw() == []
        assert not prefetch.pending and gg.calls == []
        prefetch.schedule(time.perf_counter())
        _wait_for(lambda: gg.calls)
        assert prefetch.withdraw() == ["owed"]  # the GG gave them out: the worker must run them
        assert prefetch.withdraw() == []
    finally:
        prefetch.close()
    assert len(gg.calls) == 1


def test_a_failed_request_raises_in_the_training_thread():
    prefetch = GroupPrefetch(FakeGG(error=WorkerError("the GG is gone")).request, "worker 2", timeout_s=5)
    try:
        prefetch.schedule(time.perf_counter())
        with pytest.raises(WorkerError, match="the GG is gone"):
            prefetch.take()
    finally:
        prefetch.close()


def test_an_unanswered_request_times_out_naming_the_worker():
    release = threading.Event()
    prefetch = GroupPrefetch(FakeGG(block=release).request, "worker 5", timeout_s=0.3)
    try:
        prefetch.schedule(time.perf_counter())
        with pytest.raises(WorkerError, match="worker 5 waited .* Group Generator"):
            prefetch.take()
    finally:
        release.set()
        prefetch.close()


def test_misuse_is_refused():
    prefetch = GroupPrefetch(FakeGG().request, "worker 0", timeout_s=5)
    try:
        with pytest.raises(RuntimeError, match="no Group Generator request scheduled"):
            prefetch.take()
        prefetch.schedule(time.perf_counter() + 60)
        with pytest.raises(RuntimeError, match="already pending"):
            prefetch.schedule(time.perf_counter() + 60)
    finally:
        prefetch.close()


def test_ask_time_leads_the_expected_end_by_at_most_half_the_compute():
    assert ask_after_s(0.050, 5.0) == pytest.approx(0.045)
    assert ask_after_s(0.004, 5.0) == pytest.approx(0.002)
    assert ask_after_s(0.050, 0.0) == pytest.approx(0.050)
    estimate = ComputeEstimate()
    assert estimate.value is None
    estimate.add(0.05)
    estimate.add(0.10)
    assert estimate.value == pytest.approx(0.06)
