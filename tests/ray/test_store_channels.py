"""A Ray job's channels on the driver's store, without Ray: the driver's writes reach a worker's view,
a worker's writes reach the driver, reports of a replaced process are dropped, and a worker whose
driver is gone is told so."""

import queue
import threading
import time

import pytest

from hetrain.jobs.context import LauncherMembership
from hetrain.ray.channels import VIEW_REFRESH_S, DriverChannels, WorkerChannels
from hetrain.ray.driver_store import DriverStore, connect

SECRET = "a3" * 32  # the job's (the driver draws one per job and hands it to the actors in their Ray call)


def _eventually(predicate, within_s: float = 2.0) -> bool:
    deadline = time.monotonic() + within_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(VIEW_REFRESH_S)
    return True


def _next_message(channels):
    deadline = time.monotonic() + 2.0
    while True:
        try:
            return channels.messages.get_nowait()
        except queue.Empty:
            if time.monotonic() > deadline:
                raise
            time.sleep(VIEW_REFRESH_S)


@pytest.fixture
def driver():
    server = DriverStore("127.0.0.1", timeout_s=10)
    try:
        yield server, DriverChannels(server.store, 3, results=queue.Queue(), secret=SECRET)
    finally:
        server.close()


@pytest.fixture
def workers():
    """``worker(server, rank, incarnation=0, lost=None)``: a worker's channels, closed at the end."""
    made = []

    def make(server, rank, incarnation=0, lost=None):
        made.append(WorkerChannels(lambda: connect(*server.address, 10), 3, rank, incarnation,
                                   lost or (lambda e: None), SECRET))
        return made[-1]

    try:
        yield make
    finally:
        for channels in made:
            channels.close()


def test_the_store_listens_on_the_address_it_was_given_only(loopback, driver):
    import psutil

    server, _ = driver
    mine = [c.laddr for c in psutil.Process().net_connections(kind="inet") if c.status == psutil.CONN_LISTEN
            and c.laddr.port == server.port]
    assert mine and all(addr.ip.removeprefix("::ffff:") == "127.0.0.1" for addr in mine), mine


def test_the_drivers_membership_reaches_a_workers_view(loopback, driver, workers):
    server, channels = driver
    worker = workers(server, 1)
    membership = LauncherMembership(worker.dead, worker.incarnations, 1, 0, worker.report, worker.closing.wait,
                                    worker.finished, worker.stops)
    assert membership.dead() == set() and membership.incarnations() == [0, 0, 0]
    channels.dead[2] = 1
    channels.incarnations[2] = 1
    assert _eventually(lambda: membership.dead() == {2} and membership.incarnations() == [0, 0, 1])
    assert not membership.freeze(0.05)  # not closed yet
    channels.closing.set()
    assert membership.freeze(1.0)
    channels.stop.set()
    assert _eventually(worker.stop.is_set)


def test_a_workers_writes_and_reports_reach_the_driver(loopback, driver, workers):
    server, channels = driver
    worker = workers(server, 0)
    membership = LauncherMembership(worker.dead, worker.incarnations, 0, 0, worker.report, worker.closing.wait,
                                    worker.finished, worker.stops)
    membership.record_finish([1], [2])
    assert channels.finished[0] == 1 and channels.stops[0 * 3 + 1] == 1 and channels.stops[0 * 3 + 2] == 2
    worker.ready[0] = 1
    assert list(channels.ready[r] for r in range(3)) == [1, 0, 0]
    worker.report({"iteration": 5})  # a queue push is not answered: it lands a moment later
    assert _next_message(channels) == (0, {"iteration": 5})
    with pytest.raises(queue.Empty):
        channels.messages.get_nowait()


def test_reports_of_a_replaced_process_are_dropped(loopback, driver, workers):
    server, channels = driver
    old = workers(server, 2, incarnation=0)
    channels.incarnations[2] = 1  # the driver started its replacement
    new = workers(server, 2, incarnation=1)
    old.report({"iteration": 9})
    new.report({"joined": 1})
    assert _next_message(channels) == (2, {"joined": 1})


def test_a_worker_learns_its_driver_is_gone(loopback, workers):
    server = DriverStore("127.0.0.1", timeout_s=10)
    DriverChannels(server.store, 2, results=queue.Queue(), secret=SECRET)
    lost = threading.Event()
    workers(server, 0, lost=lambda error: lost.set())
    server.close()
    del server
    assert lost.wait(10), "the worker's view went on as if the driver were there"
