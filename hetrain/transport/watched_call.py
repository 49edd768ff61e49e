"""A blocking call that gives up as soon as the launcher reports a death it waits on.

gloo cannot be told to stop waiting for a peer, and a peer that died before it ever connected
(a death during start-up, or a worker SIGSTOPped and then killed) is waited for the whole timeout:
gloo retries the connection until then. The call runs on a thread of its own; the caller polls
the deaths and, once one concerns the call, abandons the thread (it ends at its own timeout; what
it held is never used again) and raises :class:`DeathDuringCall`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hetrain.errors import WorkerError
from hetrain.transport.device_thread import device_thread

POLL_S = 0.05


class DeathDuringCall(WorkerError):
    """Raised by :func:`call_unless_dead` when ``dead`` died while the call waited."""

    def __init__(self, what: str, dead: set[int]):
        super().__init__(f"{what} abandoned: worker(s) {sorted(dead)} died")
        self.dead = dead


def call_unless_dead(call: Callable[[], object], deaths: Callable[[], set[int]], what: str,
                     name: str = "hetrain-watched") -> object:
    """``call()``'s value, or DeathDuringCall as soon as ``deaths()`` (the deaths that concern it) is non-empty."""
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = call()
        except Exception as exc:  # re-raised below unless a death explains it
            result["error"] = exc

    # on the caller's GPU, if it has one (CUDA's current device is per thread)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_initialized() else None
    thread = device_thread(run, name=name, device=device)
    while thread.is_alive():
        thread.join(POLL_S)
        dead = deaths()
        if dead and thread.is_alive():
            raise DeathDuringCall(what, dead)
    if "error" in result:
        raise result["error"]
    return result.get("value")
