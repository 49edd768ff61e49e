"""Each worker process's own queues to the launcher, read by the launcher as one.

A ``multiprocessing`` queue's writers share one lock, held while a message goes down its pipe: a
worker SIGKILLed while holding it (a kill at any moment: as its heartbeat or a report was being
written) left the lock taken for good, and every other worker's messages (heartbeats, "finishing",
results) stopped reaching the launcher; the survivors then waited out their timeout ("waited 20 s
for the launcher to close the membership"). So every process writes to queues of its own, made when
it starts, and a death can stop only its own messages.
"""

from __future__ import annotations

import queue
import time

_POLL_S = 0.002


def own_queues(context) -> tuple:
    """A new process's own (results, messages) queues."""
    return context.Queue(), context.Queue()


class MergedQueue:
    """The ``which`` queue (``results`` or ``messages``) of every process started, read as one: each
    process's messages in its order; among processes, whichever has one first."""

    def __init__(self, which: str, mailboxes: list):
        self.which = which
        self.mailboxes = mailboxes  # the launcher appends each process's channels as it starts it

    def get_nowait(self):
        for mailbox in self.mailboxes:
            try:
                return getattr(mailbox, self.which).get_nowait()
            except queue.Empty:
                continue
        raise queue.Empty

    def get(self, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.get_nowait()
            except queue.Empty:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                time.sleep(min(_POLL_S, left))
