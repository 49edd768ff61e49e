"""A parameter-server baseline: the global model lives on rank 0.

After each local step a worker pushes its *delta* (its model minus the model
it last pulled) and gets the global model back. What the server adds and whom
it answers when is the pure :class:`~hetrain.protocols.ps_logic.ParameterServerLogic`
(synchronous with ``staleness=0``, stale-synchronous with ``staleness > 0``),
the same object the simulator drives.

Rank 0 is also a worker: its pushes go to the server in-process. The others'
messages travel on the same wire as every protocol's,
:class:`~hetrain.transport.peer_channels.PeerChannels` (the payloads on the host):
a push is an UPDATE (the delta) or a DELTA (its compressed form), a worker that
stops sends STOP (``leave``) and is no longer waited for; rank 0's receiver
thread for each worker hands the server its messages, and the server answers
with an UPDATE (the global model) or a DELTA, then STOP once the worker left.
When all have left, rank 0 broadcasts the global model so every worker ends
with it. Deaths reach the server as they reach every protocol: a lost worker is
a suspect until the membership names it dead (``Membership.confirm_dead``'s bound).
A worker that joins the running job (a new member, or a dead one's replacement
under ``respawn``) announces itself and pushes nothing (zeros); once the launcher
admits it, rank 0 sees it at its next push, waits for it from then on and answers
that first push with the global model, which the joiner trains from.

Emulated links (:mod:`hetrain.transport.link`): pushes and answers carry the
link's stamps, and the receiving side holds each until the link would have
delivered it (rank 0's ingress takes every push: the server's bottleneck).
Compression: a push is the compressed delta with error feedback
(:mod:`hetrain.compression.error_feedback`); an answer is the compressed
difference between the global model and the server's copy of what that worker
holds (its first answer in full), so nothing is lost on either way.

Every 100 MB message of a large model (a delta, an answer, a received one) is
a CPU buffer from a :class:`~hetrain.transport.buffer_pool.BufferPool` (the
model's own when it lives on the CPU), not a fresh allocation per step. Rank 0
holds a round's deltas and answers at once and few between rounds, so its pool
keeps that many idle buffers instead of one (memory stays what a round needs).
"""

from __future__ import annotations

import threading
import time
from collections import deque

import torch
import torch.distributed as dist

from hetrain.comm.settings import CommSettings
from hetrain.compression.codecs import Codec, make_codec
from hetrain.compression.error_feedback import ErrorFeedback
from hetrain.compression.spec import CompressionSpec
from hetrain.errors import UsageError, WorkerError
from hetrain.protocols.options import options_or_settings
from hetrain.protocols.ps_logic import ParameterServerLogic, PSOptions, ServerStep
from hetrain.runtime.consensus import over_survivors
from hetrain.runtime.protocol import SyncProtocol, comm_from
from hetrain.runtime.public_signature import document_settings, keywords_given
from hetrain.transport.buffer_pool import DEFAULT_CAPACITY, DEFAULT_SPARE, BufferPool
from hetrain.transport.job import DEFAULT_TIMEOUT_S
from hetrain.transport.link_spec import LinkSpec
from hetrain.transport.membership import LostPeers
from hetrain.transport.peer_channels import DELTA, STOP, UPDATE, Message, PeerChannels

_POLL_S = 0.02
# A worker waits for its answer before it pushes again, so at most one answer (then the STOP) is in
# flight to a worker: a window of 2 never blocks a healthy job and bounds the memory of a broken one.
_MESSAGES_IN_FLIGHT = 2


class _Server:
    """Rank 0's server: the global model, the logic's decisions carried out, answers sent on ``channels``."""

    def __init__(self, model: torch.Tensor, logic: ParameterServerLogic, channels, buffers: BufferPool,
                 codec: Codec | None = None):
        self.model = model
        self.buffers = buffers
        self.logic = logic
        self.channels = channels
        self.cond = threading.Condition()
        self.local_reply: torch.Tensor | None = None
        self.messages = 0
        self.codec = codec
        self._copies: dict[int, torch.Tensor] = {}  # compression: what each worker holds of the global model
        self.answer_bytes = self.answer_bytes_uncompressed = 0

    def push(self, worker: int, delta: torch.Tensor) -> None:
        with self.cond:
            self.messages += 1
            self._carry_out(self.logic.push(worker, delta))
            self.cond.notify_all()

    def leave(self, worker: int) -> None:
        with self.cond:
            self.messages += 1
            self._carry_out(self.logic.leave(worker))
            self.cond.notify_all()

    def join(self, worker: int) -> None:
        """``worker``'s new process trains from now on; its first answer is the global model in full."""
        with self.cond:
            self.messages += 1
            self._copies.pop(worker, None)
            self._carry_out(self.logic.join(worker))
            self.cond.notify_all()

    def _carry_out(self, step: ServerStep) -> None:
        for payload in step.apply:
            self.model.add_(payload, alpha=step.weight)
        for worker in step.answer:
            self._answer(worker)

    def _answer(self, worker: int) -> None:
        if worker == 0:
            self.local_reply = self.buffers.take().copy_(self.model)
            return
        kind, reply = UPDATE, None
        if self.codec is not None and worker in self._copies:
            kind, reply = DELTA, self.codec.encode(self.model - self._copies[worker])
            self.codec.add_decoded(reply, self._copies[worker])
        else:
            reply = self.buffers.take().copy_(self.model)
            if self.codec is not None:
                self._copies[worker] = self.model.clone()
        self.answer_bytes += reply.numel() * reply.element_size()
        self.answer_bytes_uncompressed += self.model.numel() * 4
        # a send that fails raises here (abort), or reaches the protocol's on_error (continue: most likely
        # the worker died a moment ago, and the membership will say so)
        self.channels.send("update", [worker], kind, payload=reply)


class ParameterServer(SyncProtocol):
    """The parameter-server baseline; ``staleness=0`` is synchronous, ``s > 0`` asynchronous (SSP).

    Its settings are :class:`~hetrain.protocols.ps_logic.PSOptions`' fields, by keyword or as ``options=``.

    Example::

        with hetrain.ParameterServer(model, optimizer, staleness=0) as sync:
            for x, y in loader:
                optimizer.zero_grad(); loss_fn(model(x), y).backward(); optimizer.step()
    """

    name = "ps"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                 staleness: int = PSOptions.staleness,
                 sync_every: int = CommSettings.sync_every, local_work: str = CommSettings.local_work,
                 outer_optimizer: str | torch.optim.Optimizer = CommSettings.outer_optimizer,
                 outer_lr: float | None = CommSettings.outer_lr, outer_momentum: float | None = CommSettings.outer_momentum,
                 compression: str | CompressionSpec = CommSettings.compression,
                 gossip_step: float | None = CommSettings.gossip_step, link_mbps: str | None = CommSettings.link_mbps,
                 link_latency_ms: str | None = CommSettings.link_latency_ms, link: LinkSpec | str | float | None = None,
                 options: PSOptions | None = None, comm: CommSettings | None = None,
                 process_group=None, timeout_s: float = DEFAULT_TIMEOUT_S, on_failure: str = "abort",
                 dead_workers=None, transport=None):
        settings = keywords_given(locals(), PSOptions)
        comm = comm_from(comm, settings, "ParameterServer")
        options = options_or_settings(PSOptions, options, settings, "ParameterServer")
        super().__init__(model, optimizer, options=options, comm=comm, process_group=process_group,
                         timeout_s=timeout_s, on_failure=on_failure, dead_workers=dead_workers, transport=transport)
        job = self.job
        self.options = options.validate(job.world_size)
        self.staleness = options.staleness
        if job.world_size > 1 and job.store is None:
            raise UsageError("ps needs the job's c10d store (torch.distributed initialised)")
        self._server: _Server | None = None
        self._cond = threading.Condition()
        self._answers: deque[Message] = deque()  # a worker's: the server's messages, oldest first
        self._errors: list[str] = []  # channel errors, raised in the main thread
        self._lost = LostPeers()  # rank 0, continue mode: workers lost, not yet named dead
        flat = self.state.gather()
        if job.world_size > 1 and not self.tolerant:
            self._wait(job.broadcast(flat), "the initial model from rank 0")
            self.state.scatter(flat)
        # continue/respawn: no broadcast, a collective a worker dead during start-up would hold for
        # --timeout; each worker takes its first step from its own initial model (hetrain train's
        # are one seeded model) and the server's model with its first answer
        self._pulled = flat.detach().cpu().clone()
        self._buffers = self._message_buffers()
        shapes = [tuple(t.shape) for t in self.state.tensors]
        self._codec = make_codec(self.compression, self.state.numel, shapes) if self.compression.enabled else None
        self._feedback = ErrorFeedback(self._codec) if self._codec is not None else None
        self.stats.extra.update(uncompressed_bytes=0, compressed_bytes=0)
        self.channels = self._channels() if job.world_size > 1 else None
        if job.rank == 0:
            codec = make_codec(self.compression, self.state.numel, shapes) if self.compression.enabled else None
            self._server = _Server(self._pulled.clone(), ParameterServerLogic(job.world_size, self.staleness),
                                   self.channels, self._buffers, codec=codec)
            for worker in sorted(self.dead):  # dead before the server was built: never waited for
                self._server.leave(worker)
        if self.channels is not None:
            self._connect()
        if self.joining and self.channels is not None:
            self._take_global_model()
        self.stats.extra.update(ps_mode="sync" if self.staleness == 0 else f"async(staleness={self.staleness})")
        self.restart_clock()

    def _message_buffers(self) -> BufferPool:
        """The pool of CPU buffers messages use; on the CPU it is the model's own (gathers too)."""
        state, world = self.state, self.job.world_size
        # rank 0: a round's deltas and answers (one per worker each) plus its own gather, delta and pull
        spare, capacity = (2 * world + 3, max(DEFAULT_CAPACITY, 2 * world + 4)) if self.job.rank == 0 else \
            (DEFAULT_SPARE + 1, DEFAULT_CAPACITY)
        pool = BufferPool(state.numel, state.dtype, torch.device("cpu"), capacity=capacity, spare=spare)
        if state.device.type == "cpu":
            state.pool = pool
        return pool

    def _channels(self) -> PeerChannels:
        """The job's peer channels, its messages on the host (the server's model and buffers live there)."""
        return self.transport.channels(self.state.numel, self.state.dtype, self._on_message, self._on_channel_error,
                                       on_host=True, max_in_flight=_MESSAGES_IN_FLIGHT, name="ps",
                                       tolerate_lost_peers=self.tolerant, new_payload=self._buffers.take,
                                       incarnation=self.incarnation, peer_incarnations=self.incarnations,
                                       link=self.link, data_layout="shared",
                                       delta_nbytes=self._codec.payload_nbytes if self._codec is not None else 0)

    def _connect(self) -> None:
        """Rank 0 to every worker, each worker to rank 0: one handshake, then a receiver per peer."""
        peers = list(range(1, self.job.world_size)) if self.job.rank == 0 else [0]
        if self.joining:  # the server trains already: no handshake (as a Hop replacement's)
            self.channels.listen("update", peers)
            return
        skipped = self.channels.handshake(peers, peers, self.dead_workers if self.tolerant else None)
        for peer in skipped:  # dead during start-up: rank 0's loop drops it (_drop_the_dead)
            self.channels.forget(peer)
        self.channels.listen("update", [p for p in peers if p not in skipped])

    def _take_global_model(self) -> None:
        """A joining worker: announce itself, push nothing, and train from the server's answer (the global
        model); the server waits for this worker once the launcher has admitted it."""
        self._announce_joined()
        self.channels.send("update", [0], UPDATE, self.stats.iterations, payload=self._buffers.take().zero_())
        self._pulled = self._receive_answer()
        self.state.scatter(self._pulled.to(self.job.device))
        self._announce_settled()

    # -- receiver threads ------------------------------------------------------
    def _on_message(self, message: Message) -> None:
        if self._server is None:  # a worker: the server's answer (or its STOP)
            with self._cond:
                self._answers.append(message)
                self._cond.notify_all()
        elif message.kind == STOP:  # rank 0: a worker left; its receiver ends with the STOP sent back
            self._server.leave(message.src)
            self.channels.send("update", [message.src], STOP)
        else:  # rank 0: a worker's push
            delta = message.payload
            if message.kind == DELTA:
                delta = self._buffers.take().copy_(self._codec.decode(message.payload))
            self._server.push(message.src, delta)

    def _on_channel_error(self, peer: int, error: str) -> None:
        with self._cond:
            if self.tolerant and self._server is not None:  # continue: a worker lost is a suspect
                self._lost.lost(peer, error)
            else:  # the server's loss ends every job; abort: any loss does
                self._errors.append(error)
            self._cond.notify_all()
        if self._server is not None:
            with self._server.cond:
                self._server.cond.notify_all()

    def _raise_errors(self) -> None:
        with self._cond:
            if self._errors:
                raise WorkerError(self._errors[0])

    # -- worker side ---------------------------------------------------------
    def _sync(self) -> None:
        self._raise_errors()
        delta = torch.sub(self.state.gather().cpu(), self._pulled, out=self._buffers.take())
        if self.job.rank == 0:
            reply = self._push_local(delta)
        else:
            message = self._feedback.encode(delta)[0] if self._feedback is not None else delta
            self.stats.extra["uncompressed_bytes"] += delta.numel() * 4
            self.stats.extra["compressed_bytes"] += message.numel() * message.element_size()
            self.channels.send("update", [0], DELTA if self._feedback is not None else UPDATE,
                               self.stats.iterations, payload=message)
            reply = self._receive_answer()
        self._pulled = reply
        self.state.scatter(reply.to(self.job.device))

    def _receive_answer(self) -> torch.Tensor:
        """The server's answer to this worker's push: the global model (or what this worker holds of it)."""
        message = self._next_from_server(f"the server's answer to push {self.stats.iterations}")
        if message.kind == DELTA:
            return torch.add(self._pulled, self._codec.decode(message.payload).to(self._pulled.dtype),
                             out=self._buffers.take())
        if message.kind != UPDATE:
            raise WorkerError(f"worker {self.job.rank}: the server stopped before answering push "
                              f"{self.stats.iterations}")
        return message.payload

    def _next_from_server(self, what: str) -> Message:
        deadline = time.monotonic() + self.job.timeout_s
        with self._cond:
            while not self._answers:
                if self._errors:
                    raise WorkerError(self._errors[0])
                if time.monotonic() > deadline:
                    raise WorkerError(f"worker {self.job.rank} waited {self.job.timeout_s:.0f} s for {what} "
                                      f"from the parameter server (rank 0)")
                self._cond.wait(_POLL_S)
            return self._answers.popleft()

    def _push_local(self, delta: torch.Tensor) -> torch.Tensor:
        server = self._server
        self._drop_the_dead()  # and take in joiners (asynchronous: a push answered at once never waits below)
        server.push(0, delta)
        deadline = time.monotonic() + self.job.timeout_s
        with server.cond:
            while server.local_reply is None:
                self._drop_the_dead()
                if time.monotonic() > deadline:
                    waiting = server.logic.waiting_for() if self.staleness == 0 else "the slowest worker"
                    raise WorkerError(f"worker 0 waited {self.job.timeout_s:.0f} s for the server to answer "
                                      f"(waiting for {waiting})")
                server.cond.wait(_POLL_S)
            reply, server.local_reply = server.local_reply, None
        return reply

    def _drop_the_dead(self) -> None:
        """Rank 0: raise a channel error; in continue mode, stop waiting for workers the membership names
        dead, and fail on a lost worker it does not name dead (:class:`~hetrain.transport.membership.LostPeers`);
        serve the workers that joined (new members, replacements) from now on."""
        for worker in sorted(self.new_deaths()):
            self.channels.forget(worker)
            if worker not in self._server.logic.left:
                self._server.leave(worker)
        back = self.rejoined()
        for worker in sorted(back):
            self._server.join(worker)
            self.channels.rejoin(worker, self.incarnations[worker])
            self.channels.listen("update", [worker])
        with self._cond:
            self._errors.extend(self._lost.settle(self.dead | back))
        self._raise_errors()

    def _wait(self, work, what: str) -> None:
        try:
            work.wait(self.job.timeout)
        except Exception as exc:
            raise WorkerError(f"worker {self.job.rank} waited {self.job.timeout_s:.0f} s for {what}: "
                              f"{str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__}") from None

    # -- leaving -------------------------------------------------------------
    def leave(self, timeout_s: float | None = None) -> bool:
        """A worker leaves as in every protocol (the server stops waiting for it); the server, rank 0, holds
        the only global model and stays: False, and it trains on."""
        if self.job.rank == 0:
            return False
        return super().leave(timeout_s)

    def should_stop(self, local_done: bool) -> bool:
        self._raise_errors()
        return bool(local_done)

    def _finish(self) -> None:
        """Leave; when every worker has left, rank 0 broadcasts the global model to all."""
        job = self.job
        if self._local_steps:  # what the server has not seen: the local steps since the last push
            self._sync()
        if job.rank == 0:
            self._server.leave(0)
            self._join_server()
            final = self._server.model.clone()
        else:
            if self.channels is not None:
                self.channels.send("update", [0], STOP)
                self._next_from_server("the server's STOP after this worker left")
                self.channels.flush()
            final = torch.empty_like(self._pulled)
        if job.world_size > 1:
            final = final.to(job.device)
            if self._beacon is not None and self._server is None:  # the server arrives once all have left
                self._beacon.wait_for_arrivals(self.dead_workers, "the final model from rank 0", last=0)
            elif self._beacon is not None:
                self._beacon.store.set(f"finished/{job.rank}", "1")
            over_survivors(job, self.dead_workers, "the final model from rank 0",
                           lambda group, survivors, private: self._broadcast_final(final, group, survivors, private),
                           name="ps-final")
        self.state.scatter(final)
        self.stats.extra.update(pushes=self.stats.iterations)
        if self._server is not None:
            self.stats.extra.update(answers_in_flight_max=self.channels.max_in_flight_seen() if self.channels else 0)
            self.stats.extra["uncompressed_bytes"] += self._server.answer_bytes_uncompressed
            self.stats.extra["compressed_bytes"] += self._server.answer_bytes

    def _broadcast_final(self, final: torch.Tensor, group, survivors: list[int], private: bool) -> None:
        """Rank 0's model to ``survivors`` (rank 0 is among them: its death would have ended the job)."""
        if private:
            options = dist.BroadcastOptions()
            options.rootRank = survivors.index(0)
            self._wait(group.broadcast([final], options), "the final model from rank 0")
        else:
            root = dist.get_global_rank(group, 0) if group is not None else 0
            self._wait(dist.broadcast(final, src=root, group=group, async_op=True), "the final model from rank 0")

    def _join_server(self) -> None:
        """Rank 0: wait until every live worker has left (bounded: the timeout without a message)."""
        server, seen, deadline = self._server, -1, time.monotonic() + self.job.timeout_s
        with server.cond:
            while server.logic.active():
                self._drop_the_dead()
                if server.messages != seen:
                    seen, deadline = server.messages, time.monotonic() + self.job.timeout_s
                elif time.monotonic() > deadline:
                    missing = sorted(server.logic.active())
                    raise WorkerError(f"worker 0 waited {self.job.timeout_s:.0f} s for workers {missing} to leave")
                server.cond.wait(_POLL_S)
        if self.channels is not None and not self.tolerant:  # continue: the survivors' broadcast is the barrier
            self.channels.flush()
        self._raise_errors()

    def _release(self) -> None:
        if self.channels is not None:
            self.channels.close()

    def _extra_state(self) -> dict:
        if self._server is None:
            return {}
        with self._server.cond:  # receiver threads apply pushes under it (staleness > 0: at any moment)
            return {"server_model": self._server.model.clone(), "pushes": list(self._server.logic.pushes)}

    def _load_extra_state(self, state: dict) -> None:
        """Rank 0 restores the global model and push counts, then every worker pulls that model
        (a collective: every worker loads its state at the same point)."""
        if self._server is not None and "server_model" in state:
            self._server.model.copy_(state["server_model"])
            self._server.logic.restore_pushes(state["pushes"])
        model = self._server.model.clone() if self._server is not None else torch.empty_like(self._pulled)
        if self.job.world_size > 1:
            model = model.to(self.job.device)
            self._wait(self.job.broadcast(model), "the resumed model")
        self._pulled = model.cpu().clone()
        self.state.scatter(model)
        if self._outer is not None:  # the next pseudo-gradient is progress from the model pulled now, not from
            self._outer.capture()  # the anchor in this worker's own file (maybe of an older round than the server's)


document_settings(ParameterServer, PSOptions)
