"""Several ranks of one job as threads of this process: the fast test tier (no processes to start).

Each rank gets a :class:`~hetrain.transport.worker_transport.Transport` of its own on one shared store
(``Transport.on_store``: real gloo groups, real point-to-point messages over loopback), and builds its
protocol with ``transport=``; nothing else differs from a multi-process job. What needs real processes
(a SIGKILL, the launcher, torchrun, start-up, replacements) stays in the multi-process tests. A rank
that dies here stops and is named dead, but its sockets stay open (a thread cannot close them as a
dead process's exit does): a peer's first send to it waits for the job's timeout instead of failing at
once. Replacements (``respawn``) connect to the dead rank's successor while such sends are pending,
and in trials here hung or, with the dead rank's groups aborted, aborted the test process at exit
(docs/decisions/one-transport.md)::

    def worker(rank):
        sync = hetrain.Hop(model, None, topology="ring", transport=rank.transport("hop"))
        ...
    results = run_threads(worker, 4)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch.distributed as dist

from hetrain.testing.fake_channels import Fabric, FakeTransport
from hetrain.transport.membership import Membership
from hetrain.transport.worker_transport import Transport


class SharedMembership(Membership):
    """Deaths the test declares (``kill(rank)``), seen by every thread-rank at once."""

    def __init__(self):
        self._dead: set[int] = set()
        self._lock = threading.Lock()

    def dead(self) -> set[int]:
        with self._lock:
            return set(self._dead)

    def kill(self, rank: int) -> None:
        with self._lock:
            self._dead.add(rank)


@dataclass
class ThreadRank:
    rank: int
    world_size: int
    store: object
    timeout_s: float
    membership: Membership | None = None
    fabric: Fabric | None = None  # channels in memory, recorded (hetrain.testing.fake_channels)

    def transport(self, kind: str) -> Transport:
        """This rank's transport for a protocol of ``kind`` (the protocol's name): its channels the fabric's
        when the job has one, else gloo's over loopback."""
        real = Transport.on_store(self.store, self.rank, self.world_size, kind, timeout_s=self.timeout_s,
                                  membership=self.membership)
        return real if self.fabric is None else FakeTransport(real.job, real.membership, self.fabric)


def run_threads(fn: Callable[..., object], world_size: int, args: tuple = (), *, timeout_s: float = 20.0,
                membership: Membership | None = None, fabric: Fabric | None = None) -> list:
    """``fn(rank, *args)`` on ``world_size`` thread-ranks; their results by rank. The first error is raised
    (naming its rank); a rank still running ``timeout_s`` after the start fails the call, naming it.
    ``fabric``: the ranks' channels run in memory on it and it records every message."""
    store = dist.HashStore()
    ranks = [ThreadRank(r, world_size, store, timeout_s, membership, fabric) for r in range(world_size)]
    results: list = [None] * world_size
    errors: dict[int, BaseException] = {}

    def run(rank: ThreadRank) -> None:
        try:
            results[rank.rank] = fn(rank, *args)
        except BaseException as exc:  # noqa: BLE001 - reported below, with its rank
            errors[rank.rank] = exc

    threads = [threading.Thread(target=run, args=(rank,), name=f"hetrain-rank{rank.rank}", daemon=True)
               for rank in ranks]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, thread in enumerate(threads) if thread.is_alive()]
    if errors:
        rank = min(errors)
        raise RuntimeError(f"thread-rank {rank} failed: {errors[rank]!r}") from errors[rank]
    if hung:
        raise TimeoutError(f"thread-ranks {hung} still running {timeout_s:.0f} s after the start")
    return results
