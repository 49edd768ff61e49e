"""A flag every process of a local job reads, that survives the death of any of them.

``multiprocessing.Event`` is a condition variable: a worker SIGKILLed while it waited on one left
a sleeper that never wakes, and the launcher's next ``set()`` blocked for ever waiting for it to
(found by killing a worker at the start barrier, issue 25); one killed inside ``is_set()`` would
leave its lock held. A byte in shared memory, without a lock, has neither problem: the launcher
writes it, workers poll it.
"""

from __future__ import annotations

import time

_POLL_S = 0.01


class SharedFlag:
    def __init__(self, context):
        self._byte = context.Array("b", 1, lock=False)

    def set(self) -> None:
        self._byte[0] = 1

    def is_set(self) -> bool:
        return bool(self._byte[0])

    def wait(self, timeout_s: float) -> bool:
        """Poll until set or ``timeout_s`` passes; whether it is set."""
        deadline = time.monotonic() + timeout_s
        while not self._byte[0]:
            if time.monotonic() > deadline:
                return False
            time.sleep(_POLL_S)
        return True
