"""Tagged point-to-point messages between neighbours over torch.distributed.

Each message is an int64 header ``[kind, iteration, count, stamp, stamp]``
optionally followed by a payload: the flat model (UPDATE, KEYFRAME) or its
compressed difference from what the receiver holds (DELTA, ``delta_nbytes``
bytes). The stamps carry the emulated link's timing
(:mod:`hetrain.transport.link`): every message is counted and, when the link is
emulated, held on the receiving thread until the link would have delivered it. One receiver thread per (peer,
channel) posts receives and hands each :class:`Message` to ``on_message``;
sends are asynchronous, so communication overlaps the next computation.
Messages between two workers on one channel arrive in the order they were sent.

Two planes (:mod:`hetrain.transport.data_plane`): headers, tokens and the handshake
travel over gloo on the host (the control plane: tags, timeouts), payloads over the
data plane, received only once their header has arrived, so that no backend's tag
matching is relied on (NCCL has none). The control plane is a process group of its
own, built on the job's store (:func:`hetrain.transport.job.private_group`): p2p
messages with fixed tags on a group that also runs collectives could be matched
against a collective's. Every member constructs its PeerChannels at the same point.

Every receive waits at most three times ``timeout_s`` (the protocol's own,
more informative timeout fires first); a receiver that times out or loses its
peer calls ``on_error(message)``, which the protocol raises in its main thread.
Where deaths are tolerated, a header wait has no such bound: repairs leave
receivers on edges that carry nothing any more, and gloo's timeout would close
every pair of the group (the protocol's waits bound everything that matters).
Sends to each peer go through a :class:`~hetrain.transport.send_window.SendWindow`:
at most ``max_in_flight`` messages outstanding per peer, each payload released
as soon as its send completes.

Replacements (``respawn``): a pair in which either side is a replacement
(incarnation above 0) talks over a two-member group named by both incarnations
(:func:`hetrain.transport.job.pair_group`); :meth:`PeerChannels.rejoin` switches a
peer to its new process. A replacement builds no world-sized group at all.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hetrain.errors import WorkerError
from hetrain.transport.data_plane import DataPlane
from hetrain.transport.device_thread import device_thread, synchronize
from hetrain.transport.job import JobView, private_group
from hetrain.transport.link import EmulatedLink
from hetrain.transport.membership import Membership
from hetrain.transport.pair_links import PairLinks
from hetrain.transport.send_window import DEFAULT_MAX_IN_FLIGHT, SendWindow
from hetrain.transport.staging import HostStaging, after_compute, compute_stream
from hetrain.transport.watched_call import call_unless_dead

UPDATE, TOKEN, STOP, KEYFRAME, DELTA = 0, 1, 2, 3, 4
MODEL_KINDS = (UPDATE, KEYFRAME)  # messages whose payload is a whole model
HEADER_NUMEL = 5
CHANNEL_TAGS = {"update": 11, "token": 12}
PAYLOAD_CHANNEL = "update"  # the one channel whose messages carry payloads
HANDSHAKE_TAG = 13
RECEIVER_TIMEOUT_FACTOR = 3
IDLE_HEADER_WAIT = datetime.timedelta(days=7)  # a header wait that tolerates an idle edge (continue, respawn)


@dataclass(frozen=True)
class Message:
    """One received message: ``kind`` is UPDATE, KEYFRAME or DELTA (with ``payload``; ``count``: the local
    steps behind it), TOKEN (``count`` tokens) or STOP."""

    channel: str
    src: int
    kind: int
    iteration: int = 0
    count: int = 0
    payload: torch.Tensor | None = None


class PeerChannels:
    def __init__(self, job: JobView, payload_numel: int, payload_dtype: torch.dtype,
                 on_message: Callable[[Message], None], on_error: Callable[[int, str], None], *,
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, name: str = "peers", tolerate_lost_peers: bool = False,
                 incarnation: int = 0, peer_incarnations: list[int] | None = None,
                 new_payload: Callable[[], torch.Tensor] | None = None, link: EmulatedLink | None = None,
                 delta_nbytes: int = 0, data_layout: str | None = None,
                 peer_gone: Callable[[int, int], bool] | None = None):
        """``on_message(message)`` and ``on_error(peer, text)`` run on receiver threads; ``max_in_flight``
        bounds the messages (both channels) outstanding to each peer. With ``tolerate_lost_peers`` a
        failed send is reported through ``on_error`` instead of raised (the protocol decides whether the
        peer died), and :meth:`forget` drops a peer known dead. ``incarnation``: this process's number
        for its rank; ``peer_incarnations``: the others' (both 0 unless replacements joined).
        ``new_payload()`` gives the buffer each update is received into (default: a fresh tensor; the
        protocols pass their :class:`~hetrain.runtime.flat_state.FlatState`'s pooled ``empty``).
        ``link``: the worker's emulated link (counts bytes; default: a fresh unconstrained one);
        ``delta_nbytes``: the size of a DELTA payload (compression on). ``data_layout``: the data plane's
        (:func:`~hetrain.transport.data_plane.data_plane_layout`; default: the environment's, else the backend's).
        ``peer_gone(peer, incarnation)``: whether the launcher names that process of ``peer`` dead (deaths
        tolerated): the first message to each peer process is then sent on a watched thread, given up as
        soon as it is (:meth:`_start_first`)."""
        self.job = job
        self.link = link if link is not None else EmulatedLink(None, job.rank)
        self.delta_nbytes = delta_nbytes
        self.on_message = on_message
        self.on_error = on_error
        self.new_payload = new_payload or (lambda: torch.empty(payload_numel, dtype=payload_dtype, device=job.device))
        self.payload_numel, self.payload_dtype = payload_numel, payload_dtype
        self._compute = compute_stream(job.device)  # the main thread's: receivers write after its queued reads
        self.max_in_flight = max_in_flight
        self.tolerate_lost_peers = tolerate_lost_peers
        self.forgotten: set[int] = set()
        self.name = name
        self._peer_gone = peer_gone
        self._reached: set[tuple[int, int]] = set()  # (peer, its incarnation) a message has been posted to
        self.incarnation = incarnation
        self._peer_incarnation = dict(enumerate(peer_incarnations or []))
        self._pairs = PairLinks(job, name, cpu=True)  # two-member groups: after a replacement joins, or tolerating deaths
        self._threads: dict[tuple[str, int, int], threading.Thread] = {}
        self._windows: dict[int, SendWindow] = {}
        self._receive_timeout = job.timeout * RECEIVER_TIMEOUT_FACTOR
        # where deaths are tolerated the graph changes, and a receiver may listen on an edge no message
        # comes over any more (a repaired edge after its replacement joined): its wait must not end in
        # gloo's timeout, which closes every pair of the group (pytorch/gloo, UnboundBuffer::waitRecv:
        # "Application timeout caused pair closure"). Every wait that matters has the protocol's timeout.
        self._header_timeout = IDLE_HEADER_WAIT if tolerate_lost_peers else self._receive_timeout
        # one group for the original processes, a two-member group per pair after a replacement joins.
        # (A group per pair from the start, which would keep a peer dead before it connected from
        # holding the group's other lazy connections, deadlocked Hop under respawn: 3 of 4 runs with 8
        # workers; the handshake instead never connects to a peer already known dead.)
        shared = incarnation == 0 and job.world_size > 1  # one worker alone (no torch.distributed) has no peers
        self.group = private_group(job, name, RECEIVER_TIMEOUT_FACTOR * job.timeout_s, cpu=True) if shared else None
        self.data = DataPlane(job, name, self._link, RECEIVER_TIMEOUT_FACTOR * job.timeout_s, incarnation=incarnation,
                              layout=data_layout)
        # a GPU model whose payloads travel through the host (every layout but nccl): pinned staging buffers
        self.staging = HostStaging(job.device) if self.data.device() != job.device else None
        self._registered = dist.PrefixStore(f"{name}-registered/", job.store) if shared and job.store else None
        if self._registered is not None:  # this process is in the shared group: peers may connect to it
            self._registered.set(str(job.rank), "1")

    def _link(self, peer: int, incarnation: int | None = None) -> tuple[object, int]:
        """(group, peer's index in it) to reach ``peer``'s process number ``incarnation`` (default: current)."""
        incarnation = self._peer_incarnation.get(peer, 0) if incarnation is None else incarnation
        if self.group is not None and self.incarnation == 0 and incarnation == 0:
            return self.group, peer
        return self._pairs.link(peer, (self.incarnation, incarnation))

    def rejoin(self, peer: int, incarnation: int) -> None:
        """``peer``'s replacement (process number ``incarnation``) joined: talk to it from now on."""
        self._peer_incarnation[peer] = incarnation
        self.forgotten.discard(peer)
        window = self._windows.pop(peer, None)
        if window is not None:
            window.close()

    def handshake(self, out_neighbors: list[int], in_neighbors: list[int],
                  dead_workers: Callable[[], set[int]] | None = None) -> set[int]:
        """Exchange one small message with every neighbour before training starts; return the peers skipped.

        gloo connects a pair of workers on its first message; doing that here keeps
        connection set-up (about a second for 8 workers on 2 cores) out of the
        measured training time, as DDP's constructor does for All-Reduce. With
        ``dead_workers`` (continue, respawn) a neighbour that is found dead meanwhile is
        not waited for (a death during start-up): its exchange is left behind, and the
        protocol repairs around it as around any death. Each exchange is posted only once the
        neighbour has joined the peer group (:meth:`_await_registered`). Returns the peers to
        forget: dead, or replaced, before the exchange.
        """
        token = torch.zeros(1, dtype=torch.int64)
        inbox = {src: torch.empty(1, dtype=torch.int64) for src in in_neighbors}
        # each exchange posted when called: with lazy connections, posting to a peer that never
        # registered (dead before it connected) blocks the caller until the timeout
        def send(dst: int):
            group, index = self._link(dst)
            return group.send([token], index, HANDSHAKE_TAG)

        def recv(src: int):
            group, index = self._link(src)
            return group.recv([inbox[src]], index, HANDSHAKE_TAG)

        exchanges = [(dst, lambda dst=dst: send(dst)) for dst in out_neighbors]
        exchanges += [(src, lambda src=src: recv(src)) for src in in_neighbors]
        data_exchanges = self._data_warmups(out_neighbors, in_neighbors) if self.data.splits else []
        peers = sorted(set(out_neighbors + in_neighbors))
        if dead_workers is None:
            try:
                works = [post() for _, post in exchanges]
                works += [post() for _, _, post in sorted(data_exchanges, key=lambda e: e[0])]
                for work in works:
                    work.wait(self.job.timeout)
            except Exception as exc:
                raise WorkerError(f"worker {self.job.rank} could not reach its neighbours {peers} within "
                                  f"{self.job.timeout_s:.0f} s: {str(exc).splitlines()[0][:160]}") from None
            return set()
        exchanges += [(peer, post) for _, peer, post in data_exchanges]
        return self._exchange_skipping_dead(exchanges, peers, dead_workers)

    def _data_warmups(self, out_neighbors: list[int], in_neighbors: list[int]) -> list[tuple]:
        """One small payload to each out-neighbour and from each in-neighbour over a split data plane,
        as (key, peer, post). NCCL builds a pair's communicator in its first send or receive, blocking
        until the peer makes the same call: posted in order of ``key`` (the pair's lower rank, higher
        rank, direction), the same on both sides, the smallest pair not yet built always has both its
        members calling for it, so one thread builds every pair without a deadlock."""
        rank, device = self.job.rank, self.data.device()
        probe = torch.zeros(1, device=device)
        inbox = {src: torch.empty(1, device=device) for src in in_neighbors}

        def key(src: int, dst: int) -> tuple[int, int, bool]:
            return min(src, dst), max(src, dst), src < dst

        warmups = [(key(rank, dst), dst, lambda dst=dst: self.data.send(probe, dst)) for dst in out_neighbors]
        warmups += [(key(src, rank), src, lambda src=src: self.data.recv(inbox[src], src)) for src in in_neighbors]
        return warmups

    def _exchange_skipping_dead(self, exchanges: list, peers: list[int], dead_workers) -> set[int]:
        """Post and wait for each (peer, post) on a thread of its own; give up on those of peers found dead
        (or replaced: a replacement is reached over a pair group once it joins)."""
        outcome: dict[int, str | None] = {}
        skipped: set[int] = set()

        def run(index: int, post) -> None:
            peer = exchanges[index][0]
            if self._peer_incarnation.get(peer, 0) > 0:
                outcome[index] = None  # a replacement already in: reached over a pair group; it has no handshake
                return
            if not self._await_registered(peer, dead_workers):
                skipped.add(index)  # dead or replaced before it joined the group: never connect to it
                return
            try:
                post().wait(self.job.timeout)
                outcome[index] = None
            except Exception as exc:  # a dead peer's connection fails, or its wait times out
                outcome[index] = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__

        for i, (peer, post) in enumerate(exchanges):
            device_thread(run, args=(i, post), name=f"hetrain-handshake-{peer}", device=self.job.device)
        deadline = time.monotonic() + self.job.timeout_s
        while True:
            dead = set(dead_workers())
            given_up = {exchanges[i][0] for i in tuple(skipped)} | dead  # threads add to it
            pending = [i for i, (peer, _) in enumerate(exchanges) if i not in outcome and peer not in given_up]
            failed = [(exchanges[i][0], outcome[i]) for i in list(outcome)
                      if outcome[i] and exchanges[i][0] not in given_up]
            if not pending and not failed:
                return {peer for peer, _ in exchanges} & given_up
            if failed or time.monotonic() > deadline:
                peer, why = failed[0] if failed else (exchanges[pending[0]][0], "no answer")
                if failed:  # a failed connection is how a death shows; the launcher says so within a second
                    if Membership.of(dead_workers).confirm_dead(among={peer}):
                        continue
                raise WorkerError(f"worker {self.job.rank} could not reach its neighbour {peer} (of {peers}) "
                                  f"within {self.job.timeout_s:.0f} s: {why}")
            time.sleep(0.01)

    def _await_registered(self, peer: int, dead_workers) -> bool:
        """Wait until ``peer``'s process has joined the shared group (True), or is found dead or replaced
        (False), at most the timeout (then True: the exchange itself times out and says so).

        gloo connects lazily, and one connection to a member that never joined (its address never
        in the store) holds every other connection of the group until the timeout, a live
        neighbour's included; a member that joined and then died fails its connection at once."""
        if self._registered is None:
            return peer not in set(dead_workers())
        membership = Membership.of(dead_workers)
        deadline = time.monotonic() + self.job.timeout_s
        while time.monotonic() < deadline:
            now = membership.incarnations()
            replaced = now is not None and now[peer] != self._peer_incarnation.get(peer, 0)
            if replaced or peer in set(dead_workers()):
                return False
            if self._registered.check([str(peer)]):
                return True
            time.sleep(0.01)
        return True

    def listen(self, channel: str, sources) -> None:
        """Start a receiver thread per source not listened to yet on ``channel``."""
        for src in sources:
            incarnation = self._peer_incarnation.get(src, 0)
            if (channel, src, incarnation) in self._threads or src in self.forgotten:
                continue
            thread = device_thread(self._receive_loop, args=(channel, src, incarnation),
                                   name=f"hetrain-recv-{channel}-{src}", device=self.job.device)
            self._threads[(channel, src, incarnation)] = thread

    def forget(self, peer: int) -> None:
        """``peer`` is dead: no more sends to it (what was in flight is dropped)."""
        self.forgotten.add(peer)
        window = self._windows.pop(peer, None)
        if window is not None:
            window.close()

    def _receive_loop(self, channel: str, src: int, incarnation: int) -> None:
        tag = CHANNEL_TAGS[channel]
        current = lambda: self._peer_incarnation.get(src, 0) == incarnation  # noqa: E731
        try:
            route = self._link(src, incarnation)
            while True:
                header = torch.empty(HEADER_NUMEL, dtype=torch.int64)
                self._wait(route[0].recv([header], route[1], tag), src, f"a {channel} header", self._header_timeout)
                kind, iteration, count, *stamps = (int(v) for v in header.tolist())
                payload = None
                if kind in MODEL_KINDS or kind == DELTA:
                    payload = self._receive_payload(kind, src, incarnation, iteration)
                self.link.arrive(_nbytes(header, payload), src, stamps)
                if not current():
                    return  # a message from a process since replaced
                self.on_message(Message(channel, src, kind, iteration, count, payload))
                if kind == STOP:
                    return
        except Exception as exc:  # surfaced in the main thread
            if src not in self.forgotten and current():
                self.on_error(src, str(exc))

    def _receive_payload(self, kind: int, src: int, incarnation: int, iteration: int) -> torch.Tensor:
        """The payload that follows a header of ``kind``, on the model's device (runs on the receiver thread,
        on its own stream: complete when returned, so the main thread may read it on any stream)."""
        delta = kind == DELTA
        numel, dtype = (self.delta_nbytes, torch.uint8) if delta else (self.payload_numel, self.payload_dtype)
        what = f"the model of iteration {iteration}"
        if self.staging is not None:  # into a pooled (pinned) host buffer, then onto the GPU
            wire = self.staging.receive_buffer(numel, dtype)
            self._wait(self.data.recv(wire, src, incarnation), src, what)
            return self.staging.incoming(wire, None if delta else self.new_payload)
        payload = torch.empty(numel, dtype=dtype, device=self.job.device) if delta else self.new_payload()
        after_compute(self._compute)  # a pooled buffer's last reads on the compute stream come first
        self._wait(self.data.recv(payload, src, incarnation), src, what)
        synchronize(self.job.device)  # this thread's own stream, now after the transfer: the payload is complete
        return payload

    def _wait(self, work, src: int, what: str, timeout: datetime.timedelta | None = None) -> None:
        try:
            work.wait(timeout or self._receive_timeout)
        except Exception as exc:
            detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if "pair closure" in str(exc):  # gloo closes every pair of a group when any of its waits times out
                raise RuntimeError(
                    f"worker {self.job.rank} lost its connection to worker {src} while waiting for {what}: "
                    f"another wait on the same group timed out, and gloo then closes all of its connections"
                ) from None
            if "imed out" in detail or "timeout" in detail.lower():
                raise RuntimeError(
                    f"worker {self.job.rank} waited more than {self._receive_timeout.total_seconds():.0f} s "
                    f"for {what} from worker {src}"
                ) from None
            raise RuntimeError(
                f"worker {self.job.rank} lost worker {src} while waiting for {what} (did it exit?): {detail[:160]}"
            ) from None

    def send(self, channel: str, dsts: list[int], kind: int, iteration: int = 0, count: int = 0,
             payload: torch.Tensor | None = None) -> None:
        """Post one message to each of ``dsts``; blocks only while a peer has a full window."""
        tag = CHANNEL_TAGS[channel]
        if payload is not None and channel != PAYLOAD_CHANNEL:
            raise ValueError(f"payloads travel on the {PAYLOAD_CHANNEL!r} channel only (one data-plane order "
                             f"per pair), not {channel!r}")
        if payload is not None and self.staging is not None and payload.device != self.data.device():
            payload = self.staging.outgoing(payload)  # one pooled host copy for every peer, held until sent
        for dst in dsts:
            if dst in self.forgotten:
                continue
            nbytes = HEADER_NUMEL * 8 + _nbytes(None, payload)
            stamps = self.link.depart(nbytes, dst)
            header = torch.tensor([kind, iteration, count, *stamps], dtype=torch.int64)

            def start(dst=dst, header=header):  # under the peer's window lock: header and payload in one order
                group, index = self._link(dst)
                works = [group.send([header], index, tag)]
                if payload is not None:
                    works.append(self.data.send(payload, dst, self._peer_incarnation.get(dst, 0)))
                return works

            try:
                self._window(dst).post(self._start_first(dst, start), header, payload)
            except Exception as exc:  # gloo raises at once on a pair whose peer is gone
                self.link.unsent(nbytes, dst, stamps)  # never left: neither counted nor holding the link
                error = str(exc) if isinstance(exc, WorkerError) else (
                    f"worker {self.job.rank} lost worker {dst} while sending to it (did it exit?): "
                    f"{str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__}")
                if not self.tolerate_lost_peers:
                    raise WorkerError(error) from None
                self.on_error(dst, error)

    def _start_first(self, dst: int, start: Callable[[], list]) -> Callable[[], list]:
        """``start`` as it posts the first message to ``dst``'s current process: on a watched thread,
        given up (:class:`~hetrain.transport.watched_call.DeathDuringCall`) as soon as the launcher names
        that process dead. gloo connects a pair on its first message and waits for a peer that never
        connects until its timeout: a replacement that died just after it was admitted, before it
        connected, held each neighbour's main thread that long, and the others waited for those
        neighbours' updates (docs/decisions/replacement-admitted-as-the-job-ends.md)."""
        incarnation = self._peer_incarnation.get(dst, 0)
        if self._peer_gone is None or (dst, incarnation) in self._reached:
            return start

        def watched() -> list:
            works = call_unless_dead(start, lambda: {dst} if self._peer_gone(dst, incarnation) else set(),
                                     f"worker {self.job.rank}'s first message to worker {dst}", "hetrain-connect")
            self._reached.add((dst, incarnation))
            return works

        return watched

    def _window(self, dst: int) -> SendWindow:
        window = self._windows.get(dst)
        if window is None:
            window = SendWindow(f"worker {self.job.rank}", dst, max_in_flight=self.max_in_flight,
                                timeout_s=self.job.timeout_s, device=self.job.device)
            self._windows[dst] = window
        return window

    def in_flight(self) -> int:
        """Messages posted and not yet seen to complete, over all peers."""
        return sum(w.in_flight for w in self._windows.values())

    def max_in_flight_seen(self) -> int:
        """The most messages ever outstanding to one peer."""
        return max((w.max_seen_in_flight for w in self._windows.values()), default=0)

    def flush(self) -> None:
        """Wait until every send has left (bounded by the timeout)."""
        for window in self._windows.values():
            window.drain()

    def join(self, progressing: Callable[[int], bool] | None = None) -> None:
        """Wait for every receiver thread to see its peer's STOP: bounded by the timeout, or, with
        ``progressing(peer)`` (a :class:`~hetrain.runtime.progress.ProgressBeacon`'s), for as long as
        the peer still takes steps."""
        for (_, peer, _), thread in self._threads.items():
            while True:
                thread.join(timeout=self.job.timeout_s if progressing is None else min(1.0, self.job.timeout_s))
                if not thread.is_alive():
                    break
                if progressing is None or not progressing(peer):
                    raise WorkerError(
                        f"worker {self.job.rank}: {thread.name} still waiting for its peer to stop, which "
                        f"made no step for {self.job.timeout_s:.0f} s")

    def close(self) -> None:
        """Stop the send reapers and drop the group; receiver threads end with their peers (or time out)."""
        for window in self._windows.values():
            window.close()
        self.group = None
        self.data.close()
        self._pairs.clear()


def _nbytes(header: torch.Tensor | None, payload: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in (header, payload) if t is not None)
