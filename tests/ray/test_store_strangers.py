"""A stranger on the driver's store (torch's TCPStore: anyone who reaches its port may write to it):
nothing it writes is unpickled, forged or replayed reports are dropped, and a forged view or value is
ignored. (The same on a whole Ray job: test_ray_hostile_peer.py.)"""

import json
import os
import pickle
import queue
import time

import pytest

from hetrain.ray.channels import MAX_REPORT_BYTES, MESSAGES_KEY, VIEW_KEY, DriverChannels, WorkerChannels
from hetrain.ray.driver_store import DriverStore, connect
from hetrain.transport.job_secret import seal

SECRET = "5e" * 32


class _Marker:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


def _drain(channels, within_s: float = 3.0) -> list:
    """Every message the driver keeps, until the queue stays empty."""
    kept, deadline = [], time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            kept.append(channels.messages.get_nowait())
        except queue.Empty:
            time.sleep(0.02)
    return kept


@pytest.fixture
def job():
    server = DriverStore("127.0.0.1", timeout_s=10)
    channels = DriverChannels(server.store, 2, results=queue.Queue(), secret=SECRET)
    worker = WorkerChannels(lambda: connect(*server.address, 10), 2, 1, 0, lambda e: None, SECRET)
    try:
        yield server, channels, worker, connect(*server.address, 10)
    finally:
        worker.close()
        server.close()


def test_a_strangers_pickles_garbage_and_forgeries_are_dropped_and_run_nothing(loopback, job, tmp_path):
    server, channels, worker, stranger = job
    marker = tmp_path / "ran"
    stranger.queue_push(MESSAGES_KEY, pickle.dumps(_Marker(marker)))
    stranger.queue_push(MESSAGES_KEY, pickle.dumps((1, 0, _Marker(marker))))
    stranger.queue_push(MESSAGES_KEY, b"\x00\xff garbage")
    stranger.queue_push(MESSAGES_KEY, b"x" * (MAX_REPORT_BYTES + 1))
    forged = json.dumps({"rank": 1, "incarnation": 0, "seq": 99, "message": {"finishing": True}}).encode()
    stranger.queue_push(MESSAGES_KEY, seal("not the job's secret 0123456789", MESSAGES_KEY, forged))
    worker.report({"iteration": 7})
    assert _drain(channels) == [(1, {"iteration": 7})]
    assert channels.messages.rejected == 5
    assert not marker.exists()


def test_a_replayed_report_is_dropped(loopback, job):
    server, channels, worker, stranger = job
    worker.report({"iteration": 3})
    captured = stranger.queue_pop(MESSAGES_KEY)  # the stranger takes the real report and sends it twice
    stranger.queue_push(MESSAGES_KEY, captured)
    stranger.queue_push(MESSAGES_KEY, captured)
    worker.report({"iteration": 4})
    assert _drain(channels) == [(1, {"iteration": 3}), (1, {"iteration": 4})]
    assert channels.messages.rejected == 1


def test_a_forged_or_old_view_and_forged_values_are_ignored(loopback, job):
    server, channels, worker, stranger = job
    old_view = stranger.get(VIEW_KEY)
    channels.dead[0] = 1  # the driver's change: version 1
    deadline = time.monotonic() + 5
    while worker.dead[0] != 1:
        assert time.monotonic() < deadline, "the driver's view never reached the worker"
        time.sleep(0.01)
    for count, view in enumerate([old_view,  # a replay of the driver's first view: dead[0] back to 0
                                  json.dumps({"version": 10**9, "values": {"stop": 1}})], start=1):
        before = worker._reader.rejected
        stranger.set(VIEW_KEY, view)
        deadline = time.monotonic() + 5
        while worker._reader.rejected == before:
            assert time.monotonic() < deadline, f"the worker did not read the stranger's view {count}"
            time.sleep(0.01)
        assert worker.dead[0] == 1 and not worker.stop.is_set()
    stranger.set("launcher/finished/1", "1")
    assert channels.finished[1] == 0
