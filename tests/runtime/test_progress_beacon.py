"""Waiting for the others at the end (hetrain.runtime.progress): a rank that arrives only after all the
others (the parameter server) is waited for while it serves the last of them, not failed for taking no
steps (a race CI hit: the straggler left, rank 0 still handling its leave, a finished worker gave up)."""

import threading
import time

import pytest
import torch.distributed as dist

from hetrain.errors import WorkerError
from hetrain.runtime.progress import ProgressBeacon

TIMEOUT_S = 0.4


def _beacon_seeing_a_stale_server():
    beacon = ProgressBeacon(dist.HashStore(), rank=1, world_size=3, timeout_s=TIMEOUT_S)
    store = beacon.store  # its namespace of the job's store
    store.set("steps/0", "3")  # the server (a worker too) stopped stepping at 3
    beacon.progressing(0)  # looked at it once ...
    time.sleep(TIMEOUT_S + 0.1)  # ... long enough ago: it no longer counts as moving
    store.set("finished/2", "1")  # the straggler has left
    return store, beacon


def test_the_server_is_waited_for_while_it_serves_the_last_worker():
    store, beacon = _beacon_seeing_a_stale_server()
    threading.Timer(TIMEOUT_S / 2, lambda: store.set("finished/0", "1")).start()  # it arrives soon
    error = None
    try:
        beacon.wait_for_arrivals(None, "the final model", last=0)  # returns: it arrived within the timeout
    except WorkerError as exc:
        error = str(exc)
    assert error is None, error


def test_a_server_that_never_arrives_is_given_up_on_after_the_timeout_naming_it():
    _, beacon = _beacon_seeing_a_stale_server()
    began = time.monotonic()
    with pytest.raises(WorkerError, match="worker 0 to reach the final model"):
        beacon.wait_for_arrivals(None, "the final model", last=0)
    assert TIMEOUT_S <= time.monotonic() - began < 5 * TIMEOUT_S
