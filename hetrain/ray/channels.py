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

The store is torch's ``TCPStore``, which anyone who reaches its port may read and write. So nothing
read from it is unpickled: every value is JSON (or an integer), sealed with the job's secret
(:mod:`hetrain.transport.job_secret`; the driver hands it to the actors in their Ray call, never through
the store), and a reader keeps only what unseals: a stranger's value, garbage, or a pickle is dropped
and counted (``rejected``). A report carries its sender's sequence number, so a replayed one is dropped
too; the view carries the driver's version, so an old view written back is ignored.

The driver's objects (:class:`DriverChannels`) and the workers' (:class:`WorkerChannels`) have the
attributes and methods of ``JobChannels``' members that the launcher and the workers use, so
:class:`hetrain.jobs.local_job.LocalJob`, :class:`~hetrain.jobs.context.LauncherMembership` and
:class:`~hetrain.jobs.start_gate.StartGate` run on them unchanged.
"""

from __future__ import annotations

import json
import queue
import threading
import time

from hetrain.errors import WorkerError
from hetrain.transport import job_secret

PREFIX = "launcher/"
VIEW_KEY = PREFIX + "view"
MESSAGES_KEY = PREFIX + "messages"
VIEW_REFRESH_S = 0.01
_POLL_S = 0.01
MAX_REPORT_BYTES = 1 << 20  # a report is a few hundred bytes; a larger value in the queue is no worker's


class StoreArray:
    """Integers kept one per store key (``launcher/NAME/I``): written by workers, read by anyone, directly;
    each value sealed under its key (a value that does not unseal reads as the last one that did)."""

    def __init__(self, store, name: str, size: int, secret: str):
        self._store, self._name, self._size, self._secret = store, name, size, secret
        self._last = [0] * size

    def create(self) -> StoreArray:
        """The driver: every value 0 (a get of a missing key would wait)."""
        keys = [self._key(i) for i in range(self._size)]
        self._store.multi_set(keys, [job_secret.seal(self._secret, key, b"0") for key in keys])
        return self

    def _key(self, index: int) -> str:
        if not 0 <= index < self._size:
            raise IndexError(index)
        return f"{PREFIX}{self._name}/{index}"

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index: int) -> int:
        key = self._key(index)
        body = job_secret.unseal(self._secret, key, self._store.get(key))
        if body is not None and body.isdigit():
            self._last[index] = int(body)
        return self._last[index]

    def __setitem__(self, index: int, value: int) -> None:
        key = self._key(index)
        self._store.set(key, job_secret.seal(self._secret, key, str(int(value)).encode()))


class DriverView:
    """The driver's published state: one key, rewritten whole on every change (the driver is its only writer).

    Ctrl-C's handler sets ``stop`` on the watch loop's thread, possibly in the middle of a publish: each
    change bumps a version, and a publish writes again until the version it wrote is the latest."""

    def __init__(self, store, size: int, secret: str):
        self._store, self._secret = store, secret
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
                body = json.dumps({"version": version, "values": self.values}).encode()
                self._store.set(VIEW_KEY, job_secret.seal(self._secret, VIEW_KEY, body))
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
    """The queue of the workers' reports, as ``JobChannels.messages`` (``get_nowait`` -> (rank, message)).

    A report is kept only if it unseals, is a JSON object of the expected fields, comes from a current
    process (a replaced process's last words are dropped) and carries a sequence number above the last one
    kept from that process (a replay is dropped); anything else counts in ``rejected``."""

    def __init__(self, store, incarnations: PublishedArray, secret: str):
        self._store, self._incarnations, self._secret = store, incarnations, secret
        self._last_seq: dict[tuple[int, int], int] = {}
        self.rejected = 0

    def get_nowait(self):
        from torch.distributed import QueueEmptyError

        while True:
            try:
                data = self._store.queue_pop(MESSAGES_KEY, block=False)
            except QueueEmptyError:
                raise queue.Empty from None
            report = self._open(data)
            if report is None:
                self.rejected += 1
                continue
            rank, incarnation, seq, message = report
            if incarnation != self._incarnations[rank]:  # a replaced process's last words are dropped
                continue
            if seq <= self._last_seq.get((rank, incarnation), -1):
                self.rejected += 1
                continue
            self._last_seq[(rank, incarnation)] = seq
            return rank, message

    def _open(self, data: bytes):
        """(rank, incarnation, seq, message) of a worker's sealed report; None for anything else."""
        body = job_secret.unseal(self._secret, MESSAGES_KEY, data) if len(data) <= MAX_REPORT_BYTES else None
        if body is None:
            return None
        try:
            report = json.loads(body)
            rank, incarnation, seq, message = (report[k] for k in ("rank", "incarnation", "seq", "message"))
        except (ValueError, TypeError, KeyError):
            return None
        if not all(type(v) is int for v in (rank, incarnation, seq)) or not 0 <= rank < len(self._incarnations):
            return None
        return rank, incarnation, seq, message


class DriverChannels:
    """The driver's side of a Ray job's channels (the fields of ``JobChannels`` that ``LocalJob`` uses);
    ``results`` is filled by :class:`hetrain.ray.actors.RayWorkers` from the actors' returns."""

    def __init__(self, store, size: int, results, secret: str):
        self.view = DriverView(store, size, secret)
        self.dead = PublishedArray(self.view, "dead")
        self.incarnations = PublishedArray(self.view, "incarnations")
        self.stop = PublishedFlag(self.view, "stop")
        self.closing = PublishedFlag(self.view, "closing")
        self.go = PublishedFlag(self.view, "go")
        self.ready = StoreArray(store, "ready", size, secret).create()
        self.finished = StoreArray(store, "finished", size, secret).create()
        self.stops = StoreArray(store, "stops", size * size, secret).create()
        self.messages = DriverMessages(store, self.incarnations, secret)
        self.results = results


class ViewReader:
    """A worker's copy of the driver's view, refreshed every :data:`VIEW_REFRESH_S` on a daemon thread.

    If the store stops answering (the driver is gone), ``on_lost(error)`` is called once and the
    thread ends. A view that does not unseal, or older than the one held, is ignored (``rejected``)."""

    def __init__(self, store, on_lost, secret: str, timeout_s: float = 60.0):
        self._store, self._secret = store, secret
        self.rejected = 0
        self._version = -1
        self.values = None
        # the driver wrote it before any actor started: only a stranger's value stands in its way
        if not _poll(lambda: self._take(self._store.get(VIEW_KEY)), timeout_s):
            raise WorkerError(f"waited {timeout_s:.0f} s for a view of the driver's that unseals with the job's "
                              f"secret at {VIEW_KEY} (something else writes it)")
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
                data = self._store.get(VIEW_KEY)
            except Exception as error:  # noqa: BLE001 - any failure of the store means the driver is unreachable
                self._on_lost(error)
                return
            self._take(data)

    def _take(self, data: bytes) -> bool:
        """Take the driver's sealed view if it is newer than the one held."""
        body = job_secret.unseal(self._secret, VIEW_KEY, data)
        try:
            view = json.loads(body) if body is not None else None
            version, values = view["version"], view["values"]
        except (ValueError, TypeError, KeyError):
            self.rejected += 1
            return False
        if type(version) is not int or version < self._version:
            self.rejected += 1
            return False
        self._version, self.values = version, values
        return True


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
    connection: the view's thread, the heartbeat's and the training thread's); ``secret``: the job's."""

    def __init__(self, stores, size: int, rank: int, incarnation: int, on_lost, secret: str):
        self.rank, self.incarnation = rank, incarnation
        self._secret = secret
        self._store = stores()
        self._report_store = stores()
        self._report_lock = threading.Lock()
        self._seq = 0
        self._reader = reader = ViewReader(stores(), on_lost, secret)
        self.dead = ViewArray(reader, "dead")
        self.incarnations = ViewArray(reader, "incarnations")
        self.stop = ViewFlag(reader, "stop")
        self.closing = ViewFlag(reader, "closing")
        self.go = ViewFlag(reader, "go")
        self.ready = StoreArray(self._store, "ready", size, secret)
        self.finished = StoreArray(self._store, "finished", size, secret)
        self.stops = StoreArray(self._store, "stops", size * size, secret)

    def close(self) -> None:
        """Stop reading the view (a worker process leaves without it; tests close theirs)."""
        self._reader.close()

    def report(self, message) -> None:
        """Send a message to the driver (from any thread): JSON (tuples arrive as lists; a number type of
        numpy's or torch's as a Python number)."""
        with self._report_lock:
            self._seq += 1
            body = json.dumps({"rank": self.rank, "incarnation": self.incarnation, "seq": self._seq,
                               "message": message}, default=_plain).encode()
            self._report_store.queue_push(MESSAGES_KEY, job_secret.seal(self._secret, MESSAGES_KEY, body))


def _plain(value):
    """JSON for a scalar of numpy's or torch's (anything else in a report is a bug of its sender)."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"a Ray worker's report holds a {type(value).__name__}, which is not JSON: {value!r}")


def _poll(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(_POLL_S)
    return True
