"""A Ray job's channels on the driver's TCPStore: what shared memory is to a local job's workers.

A local job's workers share the launcher's memory (:class:`hetrain.jobs.worker_process.JobChannels`);
a Ray job's actors may sit on other machines, so the same channels live on a ``TCPStore`` the driver
hosts (:mod:`hetrain.ray.driver_store`), under ``launcher/``:

* what only the driver writes (each rank's dead flag and incarnation; the ``stop``, ``closing`` and
  ``go`` flags) is one JSON key, ``view``, rewritten on every change; each worker reads it on a thread
  every :data:`VIEW_REFRESH_S` (one round trip), so a protocol's ``dead()`` on every step costs nothing;
* what workers write (``ready``, ``finished``, and the STOP records ``stops``) is one key per value,
  read and written directly (at the start and at the finish only);
* progress, heartbeats and membership reports go through a store queue, tagged with the sender's rank
  and incarnation: the driver drops those of a process it has already replaced.

The driver's objects (:class:`DriverChannels`) and the workers' (:class:`WorkerChannels`) have the
attributes and methods of ``JobChannels``' members that the launcher and the workers use, so
:class:`hetrain.jobs.local_job.LocalJob`, :class:`~hetrain.jobs.context.LauncherMembership` and
:class:`~hetrain.jobs.start_gate.StartGate` run on them unchanged.
"""

from __future__ import annotations

import json
import pickle
import queue
import threading
import time

PREFIX = "launcher/"
VIEW_KEY = PREFIX + "view"
MESSAGES_KEY = PREFIX + "messages"
VIEW_REFRESH_S = 0.01
_POLL_S = 0.01


class StoreArray:
    """Integers kept one per store key (``launcher/NAME/I``): written by workers, read by anyone, directly."""

    def __init__(self, store, name: str, size: int):
        self._store, self._name, self._size = store, name, size

    def create(self) -> StoreArray:
        """The driver: every value 0 (a get of a missing key would wait)."""
        self._store.multi_set([self._key(i) for i in range(self._size)], ["0"] * self._size)
        return self

    def _key(self, index: int) -> str:
        if not 0 <= index < self._size:
            raise IndexError(index)
        return f"{PREFIX}{self._name}/{index}"

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index: int) -> int:
        return int(self._store.get(self._key(index)))

    def __setitem__(self, index: int, value: int) -> None:
        self._store.set(self._key(index), str(int(value)))


class DriverView:
    """The driver's published state: one key, rewritten whole on every change (the driver is its only writer).

    Ctrl-C's handler sets ``stop`` on the watch loop's thread, possibly in the middle of a publish: each
    change bumps a version, and a publish writes again until the version it wrote is the latest."""

    def __init__(self, store, size: int):
        self._store = store
        self.values = {"dead": [0] * size, "incarnations": [0] * size, "stop": 0, "closing": 0, "go": 0}
        self._version = 0
        self._lock = threading.RLock()
        self.publish()

    def change(self, name: str, value: int, index: int | None = None) -> None:
        if index is None:
            self.values[name] = value
        else:
            self.values[name][index] = value
        self._version += 1
        self.publish()

    def publish(self) -> None:
        with self._lock:
            while True:
                version = self._version
                self._store.set(VIEW_KEY, json.dumps(self.values))
                if version == self._version:
                    return


class PublishedArray:
    """One of the driver's arrays (dead flags, incarnations): each write is published at once."""

    def __init__(self, view: DriverView, name: str):
        self._view, self._name = view, name

    def __len__(self) -> int:
        return len(self._view.values[self._name])

    def __getitem__(self, index: int) -> int:
        return self._view.values[self._name][index]

    def __setitem__(self, index: int, value: int) -> None:
        self._view.change(self._name, int(value), index)

    def __iter__(self):
        return iter(list(self._view.values[self._name]))


class PublishedFlag:
    """One of the driver's flags (stop, closing, go)."""

    def __init__(self, view: DriverView, name: str):
        self._view, self._name = view, name

    def set(self) -> None:
        self._view.change(self._name, 1)

    def is_set(self) -> bool:
        return bool(self._view.values[self._name])

    def wait(self, timeout_s: float) -> bool:
        return _poll(self.is_set, timeout_s)


class DriverMessages:
    """The queue of the workers' reports, as ``JobChannels.messages`` (``get_nowait`` -> (rank, message))."""

    def __init__(self, store, incarnations: PublishedArray):
        self._store, self._incarnations = store, incarnations

    def get_nowait(self):
        from torch.distributed import QueueEmptyError

        while True:
            try:
                rank, incarnation, message = pickle.loads(self._store.queue_pop(MESSAGES_KEY, block=False))
            except QueueEmptyError:
                raise queue.Empty from None
            if incarnation == self._incarnations[rank]:  # a replaced process's last words are dropped
                return rank, message


class DriverChannels:
    """The driver's side of a Ray job's channels (the fields of ``JobChannels`` that ``LocalJob`` uses);
    ``results`` is filled by :class:`hetrain.ray.actors.RayWorkers` from the actors' returns."""

    def __init__(self, store, size: int, results):
        self.view = DriverView(store, size)
        self.dead = PublishedArray(self.view, "dead")
        self.incarnations = PublishedArray(self.view, "incarnations")
        self.stop = PublishedFlag(self.view, "stop")
        self.closing = PublishedFlag(self.view, "closing")
        self.go = PublishedFlag(self.view, "go")
        self.ready = StoreArray(store, "ready", size).create()
        self.finished = StoreArray(store, "finished", size).create()
        self.stops = StoreArray(store, "stops", size * size).create()
        self.messages = DriverMessages(store, self.incarnations)
        self.results = results


class ViewReader:
    """A worker's copy of the driver's view, refreshed every :data:`VIEW_REFRESH_S` on a daemon thread.

    If the store stops answering (the driver is gone), ``on_lost(error)`` is called once and the
    thread ends."""

    def __init__(self, store, on_lost):
        self._store = store
        self.values = json.loads(self._store.get(VIEW_KEY))
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hetrain-ray-view", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(VIEW_REFRESH_S):
            try:
                self.values = json.loads(self._store.get(VIEW_KEY))
            except Exception as error:  # noqa: BLE001 - any failure of the store means the driver is unreachable
                self._on_lost(error)
                return


class ViewArray:
    def __init__(self, reader: ViewReader, name: str):
        self._reader, self._name = reader, name

    def __len__(self) -> int:
        return len(self._reader.values[self._name])

    def __getitem__(self, index: int) -> int:
        return self._reader.values[self._name][index]

    def __iter__(self):
        return iter(list(self._reader.values[self._name]))


class ViewFlag:
    def __init__(self, reader: ViewReader, name: str):
        self._reader, self._name = reader, name

    def is_set(self) -> bool:
        return bool(self._reader.values[self._name])

    def wait(self, timeout_s: float) -> bool:
        return _poll(self.is_set, timeout_s)


class WorkerChannels:
    """A worker's side: the view (dead, incarnations, stop, closing, go), its own arrays, and ``report``.

    ``stores``: a function returning a fresh client of the driver's store (each thread gets its own
    connection: the view's thread, the heartbeat's and the training thread's)."""

    def __init__(self, stores, size: int, rank: int, incarnation: int, on_lost):
        self.rank, self.incarnation = rank, incarnation
        self._store = stores()
        self._report_store = stores()
        self._report_lock = threading.Lock()
        self._reader = reader = ViewReader(stores(), on_lost)
        self.dead = ViewArray(reader, "dead")
        self.incarnations = ViewArray(reader, "incarnations")
        self.stop = ViewFlag(reader, "stop")
        self.closing = ViewFlag(reader, "closing")
        self.go = ViewFlag(reader, "go")
        self.ready = StoreArray(self._store, "ready", size)
        self.finished = StoreArray(self._store, "finished", size)
        self.stops = StoreArray(self._store, "stops", size * size)

    def close(self) -> None:
        """Stop reading the view (a worker process leaves without it; tests close theirs)."""
        self._reader.close()

    def report(self, message) -> None:
        """Send a picklable message to the driver (from any thread)."""
        data = pickle.dumps((self.rank, self.incarnation, message))
        with self._report_lock:
            self._report_store.queue_push(MESSAGES_KEY, data)


def _poll(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(_POLL_S)
    return True
