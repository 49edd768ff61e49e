"""Ask the Group Generator for the next iteration's groups shortly before the compute ends.

A Prague worker asks the GG for its groups after every local step and waits
for the answer: a round trip to the GG service (measured in docs/concepts/prague.md)
during which it neither computes nor averages. :class:`GroupPrefetch` sends that request from a
helper thread at ``expected end of compute - lead``, so the answer is usually
there when the step ends. The GG sees the same request, only ``lead`` earlier,
for every worker alike; which groups form and in what order is decided exactly
as before, so P-Reduce's deadlock freedom (groups sharing a member issued in
the same order on every member) is untouched. The expected compute time is an
average of the measured ones (:mod:`hetrain.protocols.request_timing`); a step that runs
longer than expected only makes its partners wait as a late request would.

A request that has been sent has taken groups from the GG: the worker owes
them. :meth:`GroupPrefetch.withdraw` (when a worker stops) cancels a request
not yet sent and otherwise returns what the sent one got, to be run.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from hetrain.errors import WorkerError


class GroupPrefetch:
    """One request in flight at most: ``schedule(at)``, then ``take()`` its groups (or ``withdraw()``)."""

    def __init__(self, request: Callable[[], list], owner: str, timeout_s: float):
        self._request = request
        self.owner = owner
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self._due: float | None = None  # perf_counter time to send at; None: nothing waiting to be sent
        self._sending = False
        self._result: tuple | None = None  # (groups, None) or (None, exception)
        self._closed = False
        self.sent_early = 0  # requests sent before take() (the round trip overlapped compute)
        self._thread = threading.Thread(target=self._loop, name="hetrain-gg-prefetch", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> bool:
        with self._cond:
            return self._due is not None or self._sending or self._result is not None

    def schedule(self, at: float) -> None:
        """Send the next request at ``at`` (``time.perf_counter()`` seconds)."""
        with self._cond:
            if self._due is not None or self._sending or self._result is not None:
                raise RuntimeError(f"{self.owner}: a Group Generator request is already pending")
            self._due = at
            self._cond.notify_all()

    def take(self) -> list:
        """The scheduled request's groups: sent now if it was not yet, then its answer awaited."""
        with self._cond:
            if self._due is not None:
                self._due = time.perf_counter()  # the step ended before the planned time: ask now
                self._cond.notify_all()
            elif not self._sending and self._result is None:
                raise RuntimeError(f"{self.owner}: take() with no Group Generator request scheduled")
            else:
                self.sent_early += 1
            return self._answer()

    def withdraw(self) -> list:
        """Cancel the request if it was not sent; if it was, the groups it got (owed by this worker)."""
        with self._cond:
            if self._due is not None:
                self._due = None
                return []
            if not self._sending and self._result is None:
                return []
            return self._answer()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)

    # -- with the lock held ------------------------------------------------------
    def _answer(self) -> list:
        deadline = time.monotonic() + self.timeout_s
        while self._result is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._closed:
                raise WorkerError(f"{self.owner} waited {self.timeout_s:.0f} s for the Group Generator's answer "
                                  "to its group request")
            self._cond.wait(min(remaining, 1.0))
        (groups, error), self._result = self._result, None
        if error is not None:
            raise error
        return groups

    def _loop(self) -> None:
        with self._cond:
            while True:
                while not self._closed and (self._due is None or time.perf_counter() < self._due):
                    self._cond.wait(None if self._due is None else max(0.0, self._due - time.perf_counter()))
                if self._closed:
                    return
                self._due, self._sending = None, True
                self._cond.release()
                try:
                    result = (self._request(), None)
                except BaseException as exc:  # handed to the training thread by take()/withdraw()
                    result = (None, exc)
                finally:
                    self._cond.acquire()
                self._sending, self._result = False, result
                self._cond.notify_all()
