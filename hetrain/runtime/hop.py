"""Hop and D-PSGD on torch.distributed: the pure HopWorker logic driven by real messages.

    with hetrain.Hop(model, optimizer, topology="ring") as sync:     # Hop's defaults for b, s, max_ig
        for x, y in batches:
            ...forward, backward...
            optimizer.step()          # then: send, wait as the logic says, average, take tokens

After each optimizer step the worker sends its model (tagged with the
iteration) to its out-neighbours, waits until the logic says enough
in-neighbour updates are held, averages with the renormalized weights, returns
tokens, and then waits for the tokens (or skips iterations) that let the next
iteration start. Receiving runs on background threads, sending is
asynchronous, so communication overlaps compute.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass

import torch
from torch import nn

from hetrain.comm.local_work import weights_by_circulation, weights_by_steps
from hetrain.comm.settings import CommSettings
from hetrain.compression.codecs import make_codec
from hetrain.compression.gossip_codec import PublicCopy, ReplicaSet, choco_mix
from hetrain.compression.spec import CompressionSpec
from hetrain.errors import UsageError, WorkerError
from hetrain.protocols.hop_config import DPSGDOptions, HopOptions
from hetrain.protocols.hop_logic import AveragePlan, HopWorker
from hetrain.protocols.lag_compensation import OwnProgress
from hetrain.protocols.membership import neighbour_weights, repair
from hetrain.protocols.options import options_or_settings
from hetrain.runtime.consensus import average_state
from hetrain.runtime.protocol import SyncProtocol, comm_from
from hetrain.runtime.public_signature import document_settings, keywords_given
from hetrain.topology import Topology
from hetrain.transport.device_thread import synchronize
from hetrain.transport.job import DEFAULT_TIMEOUT_S
from hetrain.transport.link_spec import LinkSpec
from hetrain.transport.membership import LostPeers
from hetrain.transport.peer_channels import (
    DELTA,
    KEYFRAME,
    MODEL_KINDS,
    STOP,
    TOKEN,
    UPDATE,
    Message,
)

DEATH_POLL_S = 0.1  # continue mode: how often a waiting worker looks for deaths
ADOPT_WAIT_S = 0.5  # a replacement: after the first neighbour's model, how long to wait for the others'
_STATS_COUNTERS = ("updates_stale", "updates_dropped", "max_iteration_gap", "skipped_iterations")  # ProtocolStats fields


@dataclass(frozen=True)
class Received:
    """A neighbour's model as the update queues hold it, and the local steps behind it."""

    model: torch.Tensor
    steps: int = 1


class Hop(SyncProtocol):
    """Queue-based decentralized training (Luo et al., "Hop", ASPLOS'19) on a directed graph.

    Its settings are :class:`~hetrain.protocols.hop_config.HopOptions`' fields, by keyword
    or as ``options=``: ``topology`` (a graph's name or a :class:`~hetrain.topology.Topology`),
    ``backup``, ``staleness``, ``max_ig``, ``skip_threshold``, ``late_updates``. Settings left as None
    take Hop's defaults for the graph (backup 1 where every worker has 2+ in-neighbours, staleness 1,
    max_ig 8, skip_threshold 2; ``skip_threshold=0`` switches skipping off); combinations that
    can deadlock are refused with the reason. ``late_updates="progress"`` averages a stale or late
    update as Hop does and puts back the worker's own steps since its iteration, which the old model
    would undo (:mod:`hetrain.protocols.lag_compensation`; not with compression).

    Example::

        model = MyNet(); optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with hetrain.Hop(model, optimizer, topology="ring", backup=1) as sync:
            for x, y in loader:
                optimizer.zero_grad(); loss_fn(model(x), y).backward(); optimizer.step()
        print(sync.metrics()["updates_stale"])
    """

    outer_mixes_momentum = True  # adapt then combine: the outer momentum travels beside the model
    _progress: OwnProgress | None = None  # late_updates="progress": this worker's own steps, by iteration
    name = "hop"
    options_class: type[HopOptions | DPSGDOptions] = HopOptions

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                 topology: str | Topology = HopOptions.topology, backup: int | None = HopOptions.backup,
                 staleness: int | None = HopOptions.staleness, max_ig: int | None = HopOptions.max_ig,
                 skip_threshold: int | None = HopOptions.skip_threshold, late_updates: str = HopOptions.late_updates,
                 sync_every: int = CommSettings.sync_every, local_work: str = CommSettings.local_work,
                 outer_optimizer: str | torch.optim.Optimizer = CommSettings.outer_optimizer,
                 outer_lr: float | None = CommSettings.outer_lr, outer_momentum: float | None = CommSettings.outer_momentum,
                 compression: str | CompressionSpec = CommSettings.compression,
                 gossip_step: float | None = CommSettings.gossip_step, link_mbps: str | None = CommSettings.link_mbps,
                 link_latency_ms: str | None = CommSettings.link_latency_ms, link: LinkSpec | str | float | None = None,
                 options: HopOptions | DPSGDOptions | None = None, comm: CommSettings | None = None,
                 process_group=None, timeout_s: float = DEFAULT_TIMEOUT_S, on_failure: str = "abort",
                 dead_workers=None, transport=None):
        settings = keywords_given(locals(), self.options_class)
        comm = comm_from(comm, settings, type(self).__name__)
        options = options_or_settings(self.options_class, options, settings, type(self).__name__)
        super().__init__(model, optimizer, options=options, comm=comm, process_group=process_group,
                         timeout_s=timeout_s, on_failure=on_failure, dead_workers=dead_workers, transport=transport)
        self.topology = self.options.topology_for(self.job.world_size)
        self.config = self.options.config_for(self.topology)
        if self.topology.num_workers != self.job.world_size:
            raise UsageError(f"topology has {self.topology.num_workers} workers but the group has "
                             f"{self.job.world_size}; they must match")
        rank = self.job.rank
        self.original_topology = self.topology
        if self.joining:  # a replacement: the graph the survivors use now (every other death repaired)
            self.topology = repair(self.original_topology, self.dead)
        self.logic = HopWorker.for_rank(self.topology, rank, self.config)
        self._progress = (OwnProgress(self.logic.progress_iterations_kept)  # to put back what old updates undo
                          if self.config.late_updates == "progress" else None)
        self._cond = threading.Condition()
        self._channel_errors: list[str] = []
        self._lost = LostPeers()  # continue mode: peers lost, not yet known dead
        self._last_sent: tuple[int, torch.Tensor] | None = None  # continue mode: (iteration, model) last sent
        self._resend: tuple | None = None  # (new out-neighbours, iteration, model) owed after a repair
        self._neighbors_stopped = False
        codec = make_codec(self.compression, self.state.numel, [tuple(t.shape) for t in self.state.tensors],
                           head=self.state.model_numel) if self.compression.enabled else None
        self._public = PublicCopy(codec) if codec is not None else None  # what out-neighbours hold of this model
        self._replicas = ReplicaSet(codec, self.state.empty) if codec is not None else None  # of in-neighbours'
        self._model_bytes = self.state.numel * 4  # one message (model, outer momentum) as float32: the compression ratio
        self.stats.extra.update(uncompressed_bytes=0, compressed_bytes=0)
        self.channels = self.transport.channels(self.state.numel, self.state.dtype, self._on_message,
                                                self._on_channel_error, tolerate_lost_peers=self.tolerant,
                                                incarnation=self.incarnation, peer_incarnations=self.incarnations,
                                                new_payload=self.state.empty, link=self.link,
                                                delta_nbytes=codec.payload_nbytes if codec is not None else 0,
                                                peer_gone=self._peer_gone if self.dead_workers is not None else None)
        if not self.joining:  # a replacement's neighbours are mid-training: no handshake
            if self._public is not None and self.job.store is not None:
                self._publish_start()
            skipped = self.channels.handshake(self.topology.out_neighbors[rank], self.topology.in_neighbors[rank],
                                              self.dead_workers if self.tolerant else None)
            for peer in skipped:  # dead during start-up: no receiver for it; the first step repairs the graph
                self.channels.forget(peer)
            if self._public is not None and self.job.store is not None:
                self._seed_shared_start(skipped)
        self.channels.listen("update", self.topology.in_neighbors[rank])
        self.channels.listen("token", self.topology.out_neighbors[rank] if self.config.uses_tokens else [])
        if self.joining:
            self._adopt_neighbours_model()
        self.restart_clock()

    def _peer_gone(self, peer: int, incarnation: int) -> bool:
        """Whether the launcher names process ``incarnation`` of ``peer`` dead (dead now, or replaced since).
        Only where someone reports deaths (``dead_workers``); without, a first send waits as gloo does."""
        now = self.membership.incarnations()
        return peer in self.dead_workers() or (now is not None and now[peer] != incarnation)

    # ----- compression: the shared start ----------------------------------------------------
    def _start_key(self, rank: int) -> str:
        return f"hetrain/{self.name}/start-digest/{rank}"

    def _publish_start(self) -> None:
        """Write a digest of the model training starts from to the job's store (before the handshake); of its
        bytes (numpy has no bfloat16)."""
        self._start = self.state.gather()
        self._start_digest = hashlib.blake2b(self._start.cpu().contiguous().view(torch.uint8).numpy().tobytes(), digest_size=16).hexdigest()
        self.job.store.set(self._start_key(self.job.rank), self._start_digest)

    def _seed_shared_start(self, skipped: set[int]) -> None:
        """Neighbours that start from this worker's own model (``hetrain train``'s seeded one: the same
        digest) already hold it: the first message on that edge is a delta, not the model in full. Both
        ends read the same digests, so they agree on it; a neighbour with another start gets a keyframe."""
        rank, store = self.job.rank, self.job.store
        # an in-neighbour whose handshake arrived had written its digest; an out-neighbour's may not be
        # there yet (then a keyframe: it seeds its replica all the same, and the keyframe overwrites it)
        same = {peer for peer in set(self.topology.out_neighbors[rank]) | set(self.topology.in_neighbors[rank])
                if peer not in skipped and store.check([self._start_key(peer)])
                and store.get(self._start_key(peer)).decode() == self._start_digest}
        self._public.seed(self._start, [d for d in self.topology.out_neighbors[rank] if d in same])
        for src in self.topology.in_neighbors[rank]:
            if src in same:
                self._replicas.keyframe(src, self._start.clone())
        self.stats.extra["shared_start_edges"] = len(same)

    def _adopt_neighbours_model(self) -> None:
        """A replacement: announce itself, then take the newest model its in-neighbours send it (each
        sends its last one when it sees this worker join) and that model's iteration."""
        self._announce_joined()
        deadline = time.monotonic() + self.job.timeout_s
        with self._cond:
            first = None
            while True:
                held = [q[-1] for q in self.logic.queues.values() if q]
                if held and first is None:
                    first = time.monotonic()
                if held and (len(held) == len(self.logic.queues) or time.monotonic() - first > ADOPT_WAIT_S):
                    break
                self._check_deaths()
                if self._channel_errors:
                    raise WorkerError(self._channel_errors[0])
                if time.monotonic() > deadline:
                    raise WorkerError(f"worker {self.job.rank} (a replacement) waited {self.job.timeout_s:.0f} s "
                                      f"for a model from its in-neighbours {sorted(self.logic.in_weights)}")
                self._cond.wait(timeout=DEATH_POLL_S)
            iteration, payload = max(held, key=lambda update: update[0])
            self.state.scatter(payload.model)
            if self._outer is not None:
                self._outer.capture()
            self.logic.iteration = iteration
            self.stats.iteration = iteration * self.sync_every  # the counter counts local steps: H per exchange
            self.stats.extra["joined_at_iteration"] = self.stats.iteration
            self.logic.max_iteration_gap = 0  # the gap to the models it adopted says nothing of the protocol
        self._announce_settled()

    # ----- receiver threads ------------------------------------------------------
    def _on_message(self, message: Message) -> None:
        received = None
        if message.kind in MODEL_KINDS or message.kind == DELTA:  # decoded on the receiving thread, unlocked
            if message.kind == KEYFRAME:
                model = self._replicas.keyframe(message.src, message.payload)
            elif message.kind == DELTA:
                model = self._replicas.delta(message.src, message.payload)
            else:
                model = message.payload
            synchronize(self.job.device)  # this receiver's own stream: decoded before the main thread reads it
            received = Received(model, max(1, message.count))
        with self._cond:
            if received is not None:
                self.logic.receive_update(message.src, message.iteration, received)
            elif message.kind == TOKEN:
                self.logic.receive_tokens(message.src, message.count)
            elif message.channel == "update":  # STOP: no more updates from src
                self.logic.sender_finished(message.src)
            else:  # STOP: no more tokens from src
                self.logic.token_source_finished(message.src)
            self._cond.notify_all()

    def _on_channel_error(self, peer: int, error: str) -> None:
        with self._cond:
            if self.tolerant:
                self._lost.lost(peer, error)
            else:
                self._channel_errors.append(error)
            self._cond.notify_all()

    # ----- deaths (continue mode) ----------------------------------------------------------
    def _check_deaths(self) -> None:
        """With the lock held: adopt deaths the launcher reported; a lost peer it never reports is an error."""
        if not self.tolerant:
            return
        new = self.new_deaths()
        if self.dead_workers is None:  # no launcher: a lost connection is all there is to go by
            new |= self._lost.suspects() - self.dead
            self.dead |= new
        seen_dead = set(self.dead)
        back = self.rejoined()
        # dead; or dead and replaced between two looks (respawn); the others, lost yet alive, are errors
        self._channel_errors.extend(self._lost.settle(self.dead | back))
        if new or back:
            self._apply_membership(new, back)
        if back - seen_dead:
            self._listen_on_interim_edges(back - seen_dead)

    def _listen_on_interim_edges(self, unseen: set[int]) -> None:
        """``unseen`` died and came back between two looks here; a neighbour that saw the death alone
        repaired its graph around it, and for that while this worker was its neighbour: it may send
        here (the model a repair owes, updates, tokens) over an edge this worker never used. gloo
        connects a pair when both ends use it, and the end that waits has no timeout
        (pytorch/gloo#520): that sender's main thread waited for ever, and its neighbours for it
        (every run with a worker 20x slower next to the dead one; 3 in about 30 with one 3x slower,
        under load). Listen on those edges too; what comes over them is dropped (not a
        neighbour now), and the listeners stay for the next repair that needs them."""
        interim = repair(self.original_topology, self.dead | unseen)
        in_weights, _, out_neighbors = neighbour_weights(interim, self.job.rank)
        self.channels.listen("update", in_weights)
        self.channels.listen("token", out_neighbors if self.config.uses_tokens else [])
        self.stats.extra["interim_edges_listened"] = self.stats.extra.get("interim_edges_listened", 0) + 1

    def _note_finished_neighbours(self) -> None:
        """Neighbours that finished before a repair made them ours never send us their STOP: count
        them as stopped (the launcher's shared record says who finished and whom each told), and send
        them nothing more. A finished worker receives nothing, and it never connects to a neighbour the
        repair gave it: the first message to it would wait in gloo's connect until the timeout while the
        others wait in the final average for this worker (seen under load: 1 run in 20)."""
        senders, token_sources = self.membership.finished_without_stop()
        for peer in senders & set(self.logic.in_weights):
            self.logic.sender_finished(peer)
        for peer in token_sources & set(self.logic.tokens):
            self.logic.token_source_finished(peer)
        for peer in (senders | token_sources) - self.channels.forgotten:
            self.channels.forget(peer)

    def _send_owed_models(self) -> None:
        """With the lock held once: send a repair's owed model, releasing the lock meanwhile (a send may
        wait for room in a peer's window, whose receiver thread may need this worker's lock)."""
        if self._resend is None:
            return
        targets, iteration, model = self._resend
        self._resend = None
        self._cond.release()
        try:
            self._send_update(targets, iteration, model)
        finally:
            self._cond.acquire()

    def _apply_membership(self, new: set[int], back: set[int]) -> None:
        """Repair the graph around the dead (and restore it for replacements that joined), then adopt the
        new neighbours (see hetrain.protocols.membership); the graph depends only on who is dead now."""
        for peer in new - back:
            self.channels.forget(peer)
        for peer in back:
            self.channels.rejoin(peer, self.incarnations[peer])
        if self._public is not None:
            for peer in new | back:  # the dead hold nothing; a replacement holds nothing yet
                self._public.forget(peer)
                self._replicas.forget(peer)
        for peer in back:  # a death and its replacement seen in one look keep the edge: start it afresh
            self.logic.replace_neighbour(peer)
        self.topology = repair(self.original_topology, self.dead)
        in_weights, self_weight, out_neighbors = neighbour_weights(self.topology, self.job.rank)
        self._forget_changed_edges(out_neighbors)
        new_out = self.logic.reconfigure(in_weights, self_weight, out_neighbors)
        self.channels.listen("update", in_weights)
        self.channels.listen("token", out_neighbors if self.config.uses_tokens else [])
        # new out-neighbours may be waiting for the model already sent; a replacement that is an
        # out-neighbour still needs one (its predecessor got it), even where the edge never changed
        # (a death and its replacement's join seen in one look: the graph is the same before and after)
        owed = set(new_out) | (back & set(out_neighbors))
        if self._resend is not None:  # an earlier repair's, not sent yet: its targets still alive are owed too
            owed |= set(self._resend[0]) & set(out_neighbors)
        if self._last_sent is not None and owed:
            self._resend = (sorted(owed), *self._last_sent)
        self.stats.extra["graph_repairs"] = self.stats.extra.get("graph_repairs", 0) + 1
        self._note_finished_neighbours()  # new neighbours that have finished: owed nothing, never waited for
        if back:
            self.stats.extra["neighbours_joined"] = self.stats.extra.get("neighbours_joined", 0) + len(back)

    def _forget_changed_edges(self, out_neighbors: list[int]) -> None:
        """Compression: an out-edge that went away or came back leaves its receiver with a stale copy of
        this worker's public copy (it got none of the deltas meanwhile): the next message to it is a
        keyframe. The sender decides; receivers keep their replicas, which a keyframe overwrites (a
        receiver that dropped one while its sender saw no change would get a delta it cannot decode)."""
        if self._public is not None:
            for dst in set(self.logic.out_neighbors) ^ set(out_neighbors):
                self._public.forget(dst)

    # ----- the protocol -------------------------------------------------------------
    def _wait(self, ready) -> bool:
        """Wait (holding the lock) until ``ready()``; False if stopped neighbours make it impossible."""
        deadline = time.monotonic() + self.job.timeout_s
        tick = DEATH_POLL_S if self.tolerant else 1.0
        self._check_deaths()
        while not ready():
            self._check_deaths()
            if self.tolerant:  # only while blocked: nothing to learn from it on the step's hot path
                self._note_finished_neighbours()
            self._send_owed_models()
            if self._channel_errors:
                raise WorkerError(self._channel_errors[0])
            if self.logic.blocked_by_stopped_neighbors():
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerError(
                    f"worker {self.job.rank} waited {self.job.timeout_s:.0f} s for {self.logic.waiting_for()}"
                )
            self._cond.wait(timeout=min(remaining, tick))
        return True

    def _weights_replaced(self) -> None:
        if self._progress is not None:  # loaded weights are not this worker's steps: measure from them
            self._progress.mixed(self.state.gather())
        if self._public is not None:  # the public copy was of the model before (the seeded start, on --resume):
            self._public.public = None  # the next message to every neighbour is a keyframe of the loaded one
            self._public.synced.clear()

    def _apply(self, plan: AveragePlan, own: torch.Tensor) -> None:
        self_weight, weights = plan.self_weight, [term.weight for term in plan.terms]
        if self.local_work == "auto":  # by the local steps behind each model (docs/decisions/weighted-consensus-local-work-auto.md)
            if self.topology.is_symmetric:
                self_weight, weights = weights_by_steps(weights, [term.payload.steps for term in plan.terms],
                                                        self.sync_every)
            elif self.topology.is_doubly_stochastic and (slowest := self._slowest_steps()) is not None:
                self_weight, weights = weights_by_circulation(weights, self.steps_this_exchange, slowest)
        if self._public is not None:
            own_public = self._public.public if self._public.public is not None else own
            mixed = choco_mix(own, own_public, self_weight, zip(weights, (t.payload.model for t in plan.terms)),
                              self.gossip_step, out=self.state.empty())
        else:
            mixed = torch.mul(own, self_weight, out=self.state.empty())
            for weight, term in zip(weights, plan.terms):
                mixed.add_(term.payload.model, alpha=weight)
                if self._progress is not None and (lost := self._progress.lost_steps(term)) is not None:
                    now, then = lost
                    mixed.add_(now, alpha=weight).sub_(then, alpha=weight)
        self.state.scatter(mixed)
        if self._progress is not None:
            self._progress.mixed(mixed)  # the next send's own steps are measured from here
        if plan.tokens_to:
            self.channels.send("token", plan.tokens_to, TOKEN, plan.iteration, plan.token_count)

    def _begin_iteration(self) -> None:
        """Skip iterations if far behind, then take the tokens to start one.

        Sends happen outside the lock: a send may wait for room in a peer's window,
        and that peer's receiver thread may need this worker's lock to make room.
        """
        while True:
            with self._cond:
                skip = self.logic.plan_skip()
                if skip is None:
                    if self.logic.can_start():
                        self.logic.start()
                        return
                    if not self._wait(lambda: self.logic.can_start() or self.logic.plan_skip() is not None):
                        self._neighbors_stopped = True
                        return
                    continue
                plan = self.logic.apply_skip(skip)
                self.stats.iteration += (skip.to_iteration - skip.from_iteration) * self.sync_every  # steps skipped
            self._apply(plan, self.state.gather())
            # out-neighbours may be waiting for a skipped iteration's model: send this one
            self._send_model(self.logic.iteration - 1, self.state.gather())

    def _sync(self) -> None:
        if self.tolerant:
            with self._cond:
                self._check_deaths()
                self._send_owed_models()
        if not self.logic.started and not self._neighbors_stopped:
            self._begin_iteration()  # the first iteration: take its tokens now
        if self._neighbors_stopped:
            return
        own = self.state.gather()
        self._send_model(self.logic.iteration, own)
        with self._cond:
            if not self._wait(self.logic.ready_to_average):
                self._neighbors_stopped = True
                return
            plan = self.logic.complete()
        self._apply(plan, own)  # own is not modified: it may still be on its way to the neighbours
        self._begin_iteration()

    def _send_update(self, dsts: list[int], iteration: int, model: torch.Tensor) -> None:
        """Send ``model`` to ``dsts``: as it is, or (compression) as a delta to those that hold this
        worker's public copy and a keyframe to the others."""
        steps = self.steps_this_exchange
        if self._public is None:
            self.channels.send("update", dsts, UPDATE, iteration, steps, model)
            sent = len([d for d in dsts if d not in self.channels.forgotten]) * self._model_bytes
            self.stats.extra["uncompressed_bytes"] += sent
            self.stats.extra["compressed_bytes"] += sent
            return
        dsts = [d for d in dsts if d not in self.channels.forgotten]
        delta, delta_dsts, keyframe, key_dsts = self._public.prepare(model, dsts)
        if delta is not None:
            self.channels.send("update", delta_dsts, DELTA, iteration, steps, delta)
        if keyframe is not None:
            self.channels.send("update", key_dsts, KEYFRAME, iteration, steps, keyframe)
        self.stats.extra["uncompressed_bytes"] += len(dsts) * self._model_bytes
        self.stats.extra["compressed_bytes"] += \
            (len(delta_dsts) * delta.numel() if delta is not None else 0) + \
            (len(key_dsts) * keyframe.numel() * keyframe.element_size() if keyframe is not None else 0)

    def _send_model(self, iteration: int, model: torch.Tensor) -> None:
        sent_to = list(self.logic.out_neighbors)
        self._send_update(sent_to, iteration, model)
        if self._progress is not None:
            self._progress.sent(iteration, model, self.state.empty)
        if self.tolerant:
            self._last_sent = (iteration, model)
        if self._resend is not None:  # a repair while this worker was not waiting
            with self._cond:
                if self._resend is not None:  # those just sent this newer model are owed the older one no more
                    targets = [t for t in self._resend[0] if t not in sent_to]
                    self._resend = (targets, *self._resend[1:]) if targets else None
                self._send_owed_models()

    def should_stop(self, local_done: bool) -> bool:
        return bool(local_done) or self._neighbors_stopped

    def _inherit_iteration(self, iteration: int) -> None:
        """A replacement takes its iteration from its neighbours' models (see _adopt_neighbours_model)."""

    def _finish(self) -> None:
        """Tell neighbours we stopped, wait for theirs, then average every worker's model.

        Continue mode does not wait for the neighbours' STOPs (a neighbour may learn of a
        death later than this worker and never count it as one): the survivors' final
        average is the barrier, and unsent messages are dropped with the channels.
        """
        with self._cond:
            self._check_deaths()
            self._send_owed_models()  # a replacement that joined as this worker's loop ended needs a model
        token_stops = list(self.logic.in_weights) if self.config.uses_tokens else []
        self.membership.record_finish(self.logic.out_neighbors, token_stops)
        self.channels.send("update", self.logic.out_neighbors, STOP)
        self.channels.send("token", token_stops, STOP)
        if not self.tolerant:
            self.channels.join(self._beacon.progressing if self._beacon is not None else None)
            self.channels.flush()
        if self._channel_errors:
            raise WorkerError(self._channel_errors[0])
        self.stats.extra["consensus_distance"] = average_state(self.state, self.job, self.dead_workers,
                                                               self._beacon)

    def _release(self) -> None:
        self.channels.close()

    def metrics(self) -> dict:
        counters = self.logic.counters()  # the logic's one list of counters; those ProtocolStats has go there
        for name in _STATS_COUNTERS:
            setattr(self.stats, name, counters[name])
        self.stats.extra["exchange_iteration"] = self.logic.iteration  # the logic's counter: one per exchange
        self.stats.extra.update({k: v for k, v in counters.items() if k not in _STATS_COUNTERS},
                                sends_in_flight_max=self.channels.max_in_flight_seen(),
                                updates_lag_compensated=self._progress.compensated if self._progress else 0,
                                updates_lag_uncompensated=self._progress.uncompensated if self._progress else 0)
        return super().metrics()

    def _extra_state(self) -> dict:
        return {"logic_iteration": self.logic.iteration, "counters": self.logic.counters()}

    def _align_resumed_iteration(self) -> None:
        """Every worker goes on from the lowest exchange any worker's file holds. Each writes its file on
        its own timer, so a kill can leave files exchanges apart; the one resumed furthest ahead reached
        ``--iterations`` first, its neighbours then had no updates to wait for, and a worker resumed from an
        older file left short of ``--iterations`` (106 of 120 in one CI run, 2026-12-07)."""
        if self.job.world_size == 1:
            return
        behind = self.logic.iteration - self._lowest_of_workers(self.logic.iteration, "resumed iteration")
        self.logic.iteration -= behind
        self.stats.iteration -= behind * self.sync_every  # the counter counts local steps: H per exchange

    def _load_extra_state(self, state: dict) -> None:
        # the iteration counter only: queues and tokens are rebuilt by the neighbours' next messages
        # (every worker of a job resumes together, so all counters move as one)
        self.logic.iteration = int(state["logic_iteration"])


class DPSGD(Hop):
    """Standard decentralized training (Lian et al., D-PSGD, NeurIPS'17): every iteration waits for every
    in-neighbour's model of the same iteration and averages. Hop with no backup workers, no staleness and
    no tokens (the graph bounds the gap).

    Its one setting, ``topology``, is :class:`~hetrain.protocols.hop_config.DPSGDOptions`' field.

    Example::

        with hetrain.DPSGD(model, optimizer, topology="torus") as sync:
            for x, y in loader:
                optimizer.zero_grad(); loss_fn(model(x), y).backward(); optimizer.step()
    """

    name = "dpsgd"
    options_class = DPSGDOptions

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                 topology: str | Topology = DPSGDOptions.topology,
                 sync_every: int = CommSettings.sync_every, local_work: str = CommSettings.local_work,
                 outer_optimizer: str | torch.optim.Optimizer = CommSettings.outer_optimizer,
                 outer_lr: float | None = CommSettings.outer_lr, outer_momentum: float | None = CommSettings.outer_momentum,
                 compression: str | CompressionSpec = CommSettings.compression,
                 gossip_step: float | None = CommSettings.gossip_step, link_mbps: str | None = CommSettings.link_mbps,
                 link_latency_ms: str | None = CommSettings.link_latency_ms, link: LinkSpec | str | float | None = None,
                 options: DPSGDOptions | None = None, comm: CommSettings | None = None,
                 process_group=None, timeout_s: float = DEFAULT_TIMEOUT_S, on_failure: str = "abort",
                 dead_workers=None, transport=None):
        settings = keywords_given(locals(), DPSGDOptions)  # Hop's keywords, but only those D-PSGD has
        super().__init__(model, optimizer, options=options, comm=comm, process_group=process_group,
                         timeout_s=timeout_s, on_failure=on_failure, dead_workers=dead_workers, transport=transport,
                         **settings)


document_settings(Hop, HopOptions)
document_settings(DPSGD, DPSGDOptions)
