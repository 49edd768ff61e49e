"""Each worker process's own queues to the launcher, read by the launcher as one.

A ``multiprocessing`` queue's writers share one lock, held while a message goes down its pipe: a
worker SIGKILLed while holding it (a kill at any moment: as its heartbeat or a report was being
written) left the lock taken for good, and every other worker's messages (heartbeats, "finishing",
results) stopped reaching the launcher; the survivors then waited out their timeout ("waited 20 s
for the launcher to close the membership"). So every process writes to queues of its own, made when
it starts, and a death can stop only its own messages.

A message is written whole or not at all only up to a pipe's atomic write (4,096 bytes on Linux); a
process killed in the middle of a larger one leaves part of it in its pipe, and the launcher's read of
that part waits for the rest for ever (the launcher holds the pipe's write end too, so no end of file
comes). A worker's one large message is its result (with the model snapshots: megabytes), so it goes
to a file, written and then renamed, and the queue carries the file's name (:func:`post_result`): a
kill while the file is written leaves no result, which the launcher reads as that worker's death.
"""

from __future__ import annotations

import itertools
import os
import pickle
import queue
import time
from dataclasses import dataclass

_POLL_S = 0.002
_POSTED = itertools.count()  # this process's results posted (a file each)


@dataclass(frozen=True)
class Spilled:
    """A result message kept in a file (:func:`post_result`); the launcher reads it back as it gets it."""

    path: str

    def load(self):
        try:
            with open(self.path, "rb") as handle:
                return pickle.load(handle)
        finally:
            os.unlink(self.path)


def post_result(results, message: tuple, directory: str, name: str) -> None:
    """Put ``message`` on ``results`` through a file in ``directory`` (see the module); where the file
    cannot be written (a full disk), the message goes whole through the queue, as it did before."""
    path = os.path.join(directory, f"result-{name}-{next(_POSTED)}.pkl")  # its own name: an error may follow "ok"
    try:
        with open(path + ".part", "wb") as handle:
            pickle.dump(message, handle, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(path + ".part", path)
    except OSError:
        try:
            os.unlink(path + ".part")
        except OSError:
            pass
        results.put(message)
        return
    results.put(Spilled(path))


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
                message = getattr(mailbox, self.which).get_nowait()
            except queue.Empty:
                continue
            return message.load() if isinstance(message, Spilled) else message
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
