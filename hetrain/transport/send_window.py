"""Asynchronous sends to one peer with a bounded number in flight.

On gloo, ``Work.is_completed()`` of an ``isend`` stays False until ``wait()``
is called, even after the receiver has the data (docs/decisions/bounded-sends.md). A sender that keeps each work and its tensor "until completed" keeps
them forever: memory grows with the run and every scan of the list gets slower.

:class:`SendWindow` fixes both. The caller posts its ``isend`` works with the
tensors they read; a reaper thread waits on them in posting order and drops
each message (works and tensors) the moment its sends complete. ``post`` blocks
while ``max_in_flight`` messages are outstanding (backpressure on a peer that
stopped receiving), for at most ``timeout_s``. Cost per send is O(1); memory
is at most ``max_in_flight`` messages per peer.

    window = SendWindow("worker 0", peer=1, max_in_flight=8, timeout_s=60)
    window.post(lambda: [dist.isend(header, 1), dist.isend(payload, 1)], header, payload)
    ...
    window.drain()    # every message sent (bounded by the timeout)
    window.close()
"""

from __future__ import annotations

import datetime
import threading
import time
from collections import deque
from collections.abc import Callable

from hetrain.errors import WorkerError
from hetrain.transport.device_thread import device_thread

DEFAULT_MAX_IN_FLIGHT = 8


class SendWindow:
    """Sends to ``peer`` (posted by the caller) reaped by a thread of its own; see the module docstring.

    ``owner`` names the sending worker in errors (e.g. ``"worker 3"``). A send that
    fails or does not complete within ``timeout_s`` makes the next ``post`` or
    ``drain`` raise :class:`WorkerError` naming both workers.
    """

    def __init__(self, owner: str, peer: int, *, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                 timeout_s: float = 60.0, device=None):
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.owner = owner
        self.peer = peer
        self.max_in_flight = max_in_flight
        self.timeout_s = timeout_s
        self.posted = 0  # messages posted so far
        self.max_seen_in_flight = 0
        self._queue: deque = deque()  # (works, tensors) not yet reaped, in posting order
        self._cond = threading.Condition()
        self._error: str | None = None
        self._closing = False
        self._thread = device_thread(self._reap, name=f"hetrain-send-{peer}", device=device)

    @property
    def in_flight(self) -> int:
        """Messages posted whose sends have not been seen to complete yet."""
        with self._cond:
            return len(self._queue)

    def post(self, start: Callable[[], list], *tensors) -> None:
        """Wait for room in the window, then call ``start()`` (which posts the isends) and track them.

        ``tensors`` are kept alive until the works complete (gloo reads them while sending).
        """
        with self._cond:
            self._wait_while(lambda: len(self._queue) >= self.max_in_flight, self.timeout_s,
                             lambda: f"{self.owner} waited {self.timeout_s:.0f} s for worker {self.peer} to receive "
                                     f"its messages ({len(self._queue)} in flight; did worker {self.peer} stop "
                                     "receiving?)")
            self._raise_error()
            if self._closing:  # closed meanwhile (its peer forgotten): no reaper would ever serve it
                raise WorkerError(f"{self.owner}: the send window to worker {self.peer} is closed")
            self._queue.append((start(), tensors))
            self.posted += 1
            self.max_seen_in_flight = max(self.max_seen_in_flight, len(self._queue))
            self._cond.notify_all()

    def drain(self, timeout_s: float | None = None) -> None:
        """Wait until every posted message has been sent (at most ``timeout_s``, default the window's)."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        with self._cond:
            self._wait_while(lambda: bool(self._queue), timeout_s,
                             lambda: f"{self.owner} waited {timeout_s:.0f} s for worker {self.peer} to receive its "
                                     f"last {len(self._queue)} message(s)")
            self._raise_error()

    def _wait_while(self, busy, timeout_s: float, describe) -> None:
        """With the lock held: wait while ``busy()``, no send failed and the window is open; WorkerError(describe())
        at the timeout."""
        deadline = time.monotonic() + timeout_s
        while busy() and self._error is None and not self._closing:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerError(describe())
            self._cond.wait(min(remaining, 1.0))

    def close(self) -> None:
        """Stop the reaper (after what is queued); messages still queued are dropped without waiting."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout=1.0)

    def _raise_error(self) -> None:
        if self._error is not None:
            raise WorkerError(self._error)

    def _reap(self) -> None:
        timeout = datetime.timedelta(seconds=self.timeout_s)
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                works, _ = self._queue[0]
            began = time.monotonic()
            try:
                for work in works:
                    work.wait(timeout)
            except Exception as exc:  # a timeout or a lost peer: the poster raises it
                detail = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
                waited = time.monotonic() - began
                what = (f"did not complete within {self.timeout_s:.0f} s" if waited >= 0.9 * self.timeout_s
                        else f"failed after {waited:.1f} s")  # gloo gives up at once on a closed connection
                with self._cond:
                    self._error = (f"{self.owner}: a send to worker {self.peer} {what} "
                                   f"(did worker {self.peer} exit?): {detail}")
                    self._queue.clear()
                    self._cond.notify_all()
                return
            with self._cond:
                self._queue.popleft()  # the works and their tensors go now, not later
                self._cond.notify_all()
