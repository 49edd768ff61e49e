"""Point-to-point channels in memory, with a recorder: each protocol shell's wiring seen in milliseconds.

A :class:`Fabric` is the network of one job whose ranks are threads of the test process
(:func:`hetrain.testing.thread_ranks.run_threads` with ``fabric=``): every message a protocol sends on
its channels (:class:`~hetrain.transport.peer_channels.PeerChannels`' interface, here
:class:`FakeChannels`) goes into a first-in first-out queue per (channel, sender, receiver) and is
written down in :attr:`Fabric.log` as a :class:`Sent`, so a test reads what each worker sent, to whom,
of which iteration, and what it waited for. Collectives (the final average, P-Reduce) still run on the
thread-ranks' gloo groups: the fake replaces the channels only, the seam the protocols' messages cross.

A rank the test kills (:meth:`Fabric.kill`, beside the membership's ``kill``) is unreachable: a send to
it fails as a send to a dead process does (raised, or reported through ``on_error`` where deaths are
tolerated), and its receivers end, naming it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from hetrain.errors import WorkerError
from hetrain.transport.job import JobView
from hetrain.transport.link import NO_STAMPS, EmulatedLink
from hetrain.transport.peer_channels import HEADER_NUMEL, STOP, Message
from hetrain.transport.worker_transport import Transport


@dataclass(frozen=True)
class Sent:
    """One message as its sender posted it (``payload``: a copy, or None)."""

    channel: str
    src: int
    dst: int
    kind: int
    iteration: int
    count: int
    payload: torch.Tensor | None = None
    stamps: tuple[int, int] = NO_STAMPS  # the sender's emulated link's (hetrain.transport.link)

    @property
    def nbytes(self) -> int:
        return HEADER_NUMEL * 8 + (self.payload.numel() * self.payload.element_size() if self.payload is not None else 0)


@dataclass
class Fabric:
    """The in-memory network of one job's thread-ranks, and the record of every message sent on it."""

    log: list[Sent] = field(default_factory=list)
    _queues: dict[tuple[str, int, int], deque] = field(default_factory=lambda: defaultdict(deque))
    _dead: set[int] = field(default_factory=set)
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def kill(self, rank: int) -> None:
        """``rank`` is gone: nothing reaches it any more, and what it would have sent never comes."""
        with self._cond:
            self._dead.add(rank)
            self._cond.notify_all()

    def dead(self, rank: int) -> bool:
        with self._cond:
            return rank in self._dead

    def sent(self, **match) -> list[Sent]:
        """The messages whose fields equal ``match`` (e.g. ``src=0, kind=UPDATE``), in the order sent."""
        with self._cond:
            return [m for m in self.log if all(getattr(m, k) == v for k, v in match.items())]

    def post(self, message: Sent) -> None:
        with self._cond:
            if message.dst in self._dead:
                raise ConnectionError(f"worker {message.dst} is gone")
            self.log.append(message)
            self._queues[(message.channel, message.src, message.dst)].append(message)
            self._cond.notify_all()

    def take(self, channel: str, src: int, dst: int, timeout_s: float) -> Sent:
        """The next message from ``src`` to ``dst`` on ``channel``; ConnectionError if ``src`` is gone first,
        TimeoutError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            queue = self._queues[(channel, src, dst)]
            while not queue:
                if src in self._dead:
                    raise ConnectionError(f"worker {src} is gone")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {channel} message within {timeout_s:.0f} s")
                self._cond.wait(left)
            return queue.popleft()

    def queued(self, src: int) -> int:
        with self._cond:
            return sum(len(q) for (_, s, _), q in self._queues.items() if s == src)


class FakeChannels:
    """:class:`~hetrain.transport.peer_channels.PeerChannels`' interface over a :class:`Fabric`."""

    def __init__(self, job: JobView, payload_numel: int, payload_dtype: torch.dtype,
                 on_message: Callable[[Message], None], on_error: Callable[[int, str], None], *, fabric: Fabric,
                 tolerate_lost_peers: bool = False, link: EmulatedLink | None = None, **_options):
        self.job, self.fabric = job, fabric
        self.on_message, self.on_error = on_message, on_error
        self.payload_numel, self.payload_dtype = payload_numel, payload_dtype
        self.tolerate_lost_peers = tolerate_lost_peers
        self.link = link if link is not None else EmulatedLink(None, job.rank)
        self.forgotten: set[int] = set()
        self._threads: dict[tuple[str, int], threading.Thread] = {}

    def handshake(self, out_neighbors: list[int], in_neighbors: list[int], dead_workers=None) -> set[int]:
        """Nothing to connect in memory: the peers already gone are the ones to forget."""
        return {p for p in set(out_neighbors) | set(in_neighbors) if self.fabric.dead(p)}

    def listen(self, channel: str, sources) -> None:
        for src in sources:
            if (channel, src) in self._threads or src in self.forgotten:
                continue
            thread = threading.Thread(target=self._receive_loop, args=(channel, src), daemon=True,
                                      name=f"hetrain-fake-recv-{self.job.rank}-{channel}-{src}")
            self._threads[(channel, src)] = thread
            thread.start()

    def _receive_loop(self, channel: str, src: int) -> None:
        try:
            while True:
                sent = self.fabric.take(channel, src, self.job.rank, 3 * self.job.timeout_s)
                self.link.arrive(sent.nbytes, src, sent.stamps)
                if src in self.forgotten:
                    return
                payload = sent.payload.clone() if sent.payload is not None else None
                self.on_message(Message(channel, src, sent.kind, sent.iteration, sent.count, payload))
                if sent.kind == STOP:
                    return
        except (ConnectionError, TimeoutError) as exc:
            if src not in self.forgotten:
                self.on_error(src, f"worker {self.job.rank} lost worker {src} on its {channel} channel: {exc}")

    def send(self, channel: str, dsts: list[int], kind: int, iteration: int = 0, count: int = 0,
             payload: torch.Tensor | None = None) -> None:
        copy = payload.detach().clone() if payload is not None else None  # the sender may reuse its buffer
        for dst in dsts:
            if dst in self.forgotten:
                continue
            message = Sent(channel, self.job.rank, dst, kind, iteration, count, copy)
            message = dataclasses.replace(message, stamps=self.link.depart(message.nbytes, dst))
            try:
                self.fabric.post(message)
            except ConnectionError as exc:
                self.link.unsent(message.nbytes, dst, message.stamps)
                error = f"worker {self.job.rank} lost worker {dst} while sending to it: {exc}"
                if not self.tolerate_lost_peers:
                    raise WorkerError(error) from None
                self.on_error(dst, error)

    def forget(self, peer: int) -> None:
        self.forgotten.add(peer)

    def rejoin(self, peer: int, incarnation: int) -> None:
        self.forgotten.discard(peer)

    def in_flight(self) -> int:
        """Messages this worker sent that no receiver has taken yet."""
        return self.fabric.queued(self.job.rank)

    def max_in_flight_seen(self) -> int:
        return 0

    def flush(self) -> None:
        """In memory, a send has left when it returns."""

    def join(self, progressing: Callable[[int], bool] | None = None) -> None:
        for (channel, peer), thread in self._threads.items():
            thread.join(3 * self.job.timeout_s)
            if thread.is_alive():
                raise WorkerError(f"worker {self.job.rank}: its {channel} receiver from worker {peer} still "
                                  f"waits for a STOP after {3 * self.job.timeout_s:.0f} s")

    def close(self) -> None:
        """Receivers end with their peers' STOP (or their death)."""


@dataclass(frozen=True)
class FakeTransport(Transport):
    """A transport whose channels are a :class:`Fabric`'s (collectives stay on the job's gloo groups)."""

    fabric: Fabric | None = None

    def channels(self, payload_numel: int, payload_dtype: torch.dtype, on_message, on_error, *,
                 on_host: bool = False, **options) -> FakeChannels:
        return FakeChannels(self.job, payload_numel, payload_dtype, on_message, on_error, fabric=self.fabric,
                            **options)
