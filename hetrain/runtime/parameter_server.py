"""A parameter-server baseline: the global model lives on rank 0.

After each local step a worker pushes its *delta* (its model minus the model
it last pulled) and gets the global model back. What the server adds and whom
it answers when is the pure :class:`~hetrain.protocols.ps_logic.ParameterServerLogic`
(synchronous with ``staleness=0``, stale-synchronous with ``staleness > 0``),
the same object the simulator drives.

Rank 0 is also a worker: its pushes go to the server in-process; a thread on
rank 0 receives the others' messages over a dedicated gloo group (one for
requests, one for answers, so the thread's receive never blocks a send). A
worker that stops sends ``leave`` and is no longer waited for; when all have
left, rank 0 broadcasts the global model so every worker ends with it.

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

import torch
import torch.distributed as dist

from hetrain.comm.settings import CommSettings
from hetrain.compression.codecs import Codec, make_codec
from hetrain.compression.error_feedback import ErrorFeedback
from hetrain.errors import UsageError, WorkerError
from hetrain.protocols.options import options_or_settings
from hetrain.protocols.ps_logic import ParameterServerLogic, PSOptions, ServerStep
from hetrain.runtime.consensus import over_survivors
from hetrain.runtime.protocol import SyncProtocol, comm_from
from hetrain.runtime.public_signature import document_settings
from hetrain.transport.buffer_pool import DEFAULT_CAPACITY, DEFAULT_SPARE, BufferPool
from hetrain.transport.job import DEFAULT_TIMEOUT_S, private_group
from hetrain.transport.link import EmulatedLink
from hetrain.transport.pair_links import PairLinks
from hetrain.transport.send_window import SendWindow
from hetrain.transport.watched_call import DeathDuringCall, call_unless_dead

_PUSH, _LEAVE = 0, 1
_FULL, _DELTA = 0, 1  # an answer: the global model, or its compressed difference from the worker's copy
_HEADER_NUMEL = 5  # a push: [worker, kind, pushes, stamp, stamp]
_TAG_HEADER, _TAG_DELTA, _TAG_REPLY = 1, 2, 3
_POLL_S = 0.02
# A worker waits for its answer before it pushes again, so at most one answer per worker is in
# flight: a window of 2 never blocks a healthy job and bounds the memory of a broken one.
_ANSWERS_IN_FLIGHT = 2


class _Server:
    """Rank 0's server: the global model, the logic's decisions carried out, answers in flight."""

    def __init__(self, model: torch.Tensor, logic: ParameterServerLogic, down, timeout_s: float,
                 buffers: BufferPool, tolerate_lost_workers: bool = False, link: EmulatedLink | None = None,
                 codec: Codec | None = None):
        self.tolerate_lost_workers = tolerate_lost_workers  # continue mode: a lost worker is the launcher's news
        self.unanswered: set[int] = set()  # workers an answer could not reach (continue mode)
        self.model = model
        self.buffers = buffers
        self.logic = logic
        self.down = down
        self.timeout_s = timeout_s
        self.cond = threading.Condition()
        self.local_reply: torch.Tensor | None = None
        self.messages = 0
        self.error: str | None = None
        self._windows: dict[int, SendWindow] = {}  # answers in flight, per worker
        self.link = link if link is not None else EmulatedLink(None, 0)
        self.codec = codec
        self._copies: dict[int, torch.Tensor] = {}  # compression: what each worker holds of the global model
        self.answer_bytes = self.answer_bytes_uncompressed = 0

    def push(self, worker: int, delta: torch.Tensor) -> None:
        with self.cond:
            self.messages += 1
            self._carry_out(self.logic.push(worker, delta))

    def leave(self, worker: int) -> None:
        with self.cond:
            self.messages += 1
            self._carry_out(self.logic.leave(worker))
            self.cond.notify_all()

    def _carry_out(self, step: ServerStep) -> None:
        for payload in step.apply:
            self.model.add_(payload, alpha=step.weight)
        for worker in step.answer:
            self._answer(worker)

    def _answer(self, worker: int) -> None:
        if worker == 0:
            self.local_reply = self.buffers.take().copy_(self.model)
            self.cond.notify_all()
            return
        kind, reply = _FULL, None
        if self.codec is not None and worker in self._copies:
            kind, reply = _DELTA, self.codec.encode(self.model - self._copies[worker])
            self._copies[worker].add_(self.codec.decode(reply).to(self.model.dtype))
        else:
            reply = self.buffers.take().copy_(self.model)
            if self.codec is not None:
                self._copies[worker] = self.model.clone()
        nbytes = reply.numel() * reply.element_size()
        self.answer_bytes += nbytes
        self.answer_bytes_uncompressed += self.model.numel() * 4
        header = torch.tensor([kind, *self.link.depart(nbytes + 24, worker)], dtype=torch.int64)
        window = self._windows.get(worker)
        if window is None:
            window = self._windows[worker] = SendWindow("the parameter server (rank 0)", worker,
                                                        max_in_flight=_ANSWERS_IN_FLIGHT, timeout_s=self.timeout_s)
        try:
            window.post(lambda: [self.down.send([header], worker, _TAG_REPLY),
                                 self.down.send([reply], worker, _TAG_REPLY)], header, reply)
        except Exception:  # gloo raises at once on a closed connection; the window, on a send that failed
            if not self.tolerate_lost_workers:
                raise
            # continue mode: the worker most likely died a moment ago and the launcher will say so (rank 0
            # then stops waiting for it); were it alive, it would fail waiting for this answer, naming it
            self.unanswered.add(worker)

    def answers_in_flight_max(self) -> int:
        """The most answers ever outstanding to one worker."""
        return max((w.max_seen_in_flight for w in self._windows.values()), default=0)

    def close(self, drain: bool) -> None:
        for worker, window in self._windows.items():
            if drain and worker not in self.unanswered:  # (an unreachable worker's window holds its error)
                try:
                    window.drain()
                except WorkerError:
                    # continue mode: every worker alive at the end took its last answer before it left, so
                    # a send that failed went to a worker that died (an answer is a header and a payload:
                    # the header may leave before the death, the payload fail after it)
                    if not self.tolerate_lost_workers:
                        raise
                    self.unanswered.add(worker)
            window.close()


class ParameterServer(SyncProtocol):
    """The parameter-server baseline; ``staleness=0`` is synchronous, ``s > 0`` asynchronous (SSP).

    Its settings are :class:`~hetrain.protocols.ps_logic.PSOptions`' fields, by keyword or as ``options=``.

    Example::

        with hetrain.ParameterServer(model, optimizer, staleness=0) as sync:
            for x, y in loader:
                optimizer.zero_grad(); loss_fn(model(x), y).backward(); optimizer.step()
    """

    name = "ps"

    def __init__(self, model, optimizer=None, *, options: PSOptions | None = None, comm: CommSettings | None = None,
                 process_group=None, timeout_s: float = DEFAULT_TIMEOUT_S, on_failure: str = "abort",
                 dead_workers=None, transport=None, **settings):
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
        self._thread: threading.Thread | None = None
        flat = self.state.gather()
        if job.world_size > 1:
            if not self.tolerant:
                self._wait(job.broadcast(flat), "the initial model from rank 0")
                self.state.scatter(flat)
            # continue/respawn: no broadcast, a collective a worker dead during start-up would hold for
            # --timeout; each worker takes its first step from its own initial model (hetrain train's
            # are one seeded model) and the server's model with its first answer
            if self.tolerant:  # a link per worker: one dead before it connected holds only its own
                self._up, self._down = PairLinks(job, "ps-up", cpu=True), PairLinks(job, "ps-down", cpu=True)
            else:
                self._up = private_group(job, "up", cpu=True)
                self._down = private_group(job, "down", cpu=True)
        else:
            self._up = self._down = None
        self._pulled = flat.detach().cpu().clone()
        self._buffers = self._message_buffers()
        self._codec = make_codec(self.compression, self.state.numel, [tuple(t.shape) for t in self.state.tensors]) \
            if self.compression.enabled else None
        self._feedback = ErrorFeedback(self._codec) if self._codec is not None else None
        self.stats.extra.update(uncompressed_bytes=0, compressed_bytes=0)
        if job.rank == 0:
            logic = ParameterServerLogic(job.world_size, self.staleness)
            self._server = _Server(self._pulled.clone(), logic, self._down, job.timeout_s, self._buffers,
                                   tolerate_lost_workers=self.tolerant, link=self.link,
                                   codec=make_codec(self.compression, self.state.numel,
                                                    [tuple(t.shape) for t in self.state.tensors])
                                   if self.compression.enabled else None)
            self._thread = threading.Thread(target=self._serve, name="hetrain-ps", daemon=True)
            self._thread.start()
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

    # -- worker side ---------------------------------------------------------
    def _sync(self) -> None:
        self._raise_server_error()
        delta = torch.sub(self.state.gather().cpu(), self._pulled, out=self._buffers.take())
        if self.job.rank == 0:
            reply = self._push_local(delta)
        else:
            message = self._feedback.encode(delta)[0] if self._feedback is not None else delta
            nbytes = message.numel() * message.element_size()
            self.stats.extra["uncompressed_bytes"] += delta.numel() * 4
            self.stats.extra["compressed_bytes"] += nbytes
            stamps = self.link.depart(nbytes + 8 * _HEADER_NUMEL, 0)
            header = torch.tensor([self.job.rank, _PUSH, self.stats.iterations, *stamps], dtype=torch.int64)
            self._send(header, _TAG_HEADER)
            self._send(message, _TAG_DELTA)
            reply = self._receive_answer()
        self._pulled = reply
        self.state.scatter(reply.to(self.job.device))

    def _receive_answer(self) -> torch.Tensor:
        """The server's answer to this worker's push: the global model (or what this worker holds of it)."""
        what = f"the server's answer to push {self.stats.iterations}"
        header = torch.zeros(3, dtype=torch.int64)
        self._wait(self._down.recv([header], 0, _TAG_REPLY), what)
        kind, *stamps = (int(v) for v in header)
        if kind == _DELTA:
            payload = self._codec.empty_payload("cpu")
            self._wait(self._down.recv([payload], 0, _TAG_REPLY), what)
            self.link.arrive(payload.numel() + 24, 0, stamps)
            return torch.add(self._pulled, self._codec.decode(payload).to(self._pulled.dtype),
                             out=self._buffers.take())
        reply = self._buffers.take()
        self._wait(self._down.recv([reply], 0, _TAG_REPLY), what)
        self.link.arrive(reply.numel() * reply.element_size() + 24, 0, stamps)
        return reply

    def _push_local(self, delta: torch.Tensor) -> torch.Tensor:
        server = self._server
        server.push(0, delta)
        deadline = time.monotonic() + self.job.timeout_s
        with server.cond:
            while server.local_reply is None and not server.error:
                self._drop_the_dead()
                if time.monotonic() > deadline:
                    waiting = server.logic.waiting_for() if self.staleness == 0 else "the slowest worker"
                    raise WorkerError(f"worker 0 waited {self.job.timeout_s:.0f} s for the server to answer "
                                      f"(waiting for {waiting})")
                server.cond.wait(_POLL_S)
            self._raise_server_error()
            reply, server.local_reply = server.local_reply, None
        return reply

    def _drop_the_dead(self) -> None:
        """Rank 0, continue mode: workers the launcher found dead are no longer waited for."""
        for worker in sorted(self.new_deaths()):
            if worker not in self._server.logic.left:
                self._server.leave(worker)

    def _send(self, tensor: torch.Tensor, tag: int) -> None:
        self._wait(self._up.send([tensor], 0, tag), "the parameter server (rank 0) to take its message")

    def _wait(self, work, what: str) -> None:
        try:
            work.wait(self.job.timeout)
        except Exception as exc:
            raise WorkerError(f"worker {self.job.rank} waited {self.job.timeout_s:.0f} s for {what}: "
                              f"{str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__}") from None

    # -- server thread (rank 0) ----------------------------------------------
    def _serve(self) -> None:
        if self.tolerant:
            self._serve_each_worker()
            return
        server = self._server
        remote_left = 0
        header = torch.zeros(_HEADER_NUMEL, dtype=torch.int64)
        deaths_seen: set[int] = set()
        while remote_left < self.job.world_size - 1:
            try:
                self._up.recv_anysource([header], _TAG_HEADER).wait(self.job.timeout)
                worker, kind = int(header[0]), int(header[1])
                if kind == _LEAVE:
                    remote_left += 1
                    server.leave(worker)
                    continue
                self._receive_push(worker, header)
            except Exception as exc:
                new = self.membership.confirm_dead(known=deaths_seen) if self.dead_workers else set()
                if new:  # a worker died (rank 0's loop stops waiting for it): serve the others
                    deaths_seen |= new
                    continue
                with server.cond:
                    server.error = f"parameter server on rank 0 stopped: {str(exc).splitlines()[0][:200]}"
                    server.cond.notify_all()
                return

    def _receive_push(self, worker: int, header: torch.Tensor) -> None:
        """The delta that follows ``worker``'s push ``header``, held for the link, applied by the server."""
        stamps = (int(header[3]), int(header[4]))
        if self._codec is not None:
            payload = self._codec.empty_payload("cpu")
            self._up.recv([payload], worker, _TAG_DELTA).wait(self.job.timeout)
            self.link.arrive(payload.numel() + 8 * _HEADER_NUMEL, worker, stamps)
            delta = self._buffers.take().copy_(self._codec.decode(payload))
        else:
            delta = self._buffers.take()
            self._up.recv([delta], worker, _TAG_DELTA).wait(self.job.timeout)
            self.link.arrive(delta.numel() * delta.element_size() + 8 * _HEADER_NUMEL, worker, stamps)
        self._server.push(worker, delta)

    def _serve_each_worker(self) -> None:
        """Continue mode: a receiving thread per worker (no ``recv_anysource``, which connects to every
        worker: one dead before it ever connected held the server until the timeout)."""
        threads = [threading.Thread(target=self._serve_worker, args=(w,), daemon=True, name=f"hetrain-ps-{w}")
                   for w in range(1, self.job.world_size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _serve_worker(self, worker: int) -> None:
        server = self._server
        header = torch.zeros(_HEADER_NUMEL, dtype=torch.int64)
        first = True
        while True:
            try:
                if first:  # until it connects, a worker dead during start-up would be waited for the timeout
                    call_unless_dead(lambda: self._up.recv([header], worker, _TAG_HEADER).wait(self.job.timeout),
                                     lambda: {worker} & set(self.dead_workers()), "the server's first receive")
                    first = False
                else:  # connected: a death closes the connection, and the wait fails at once
                    self._up.recv([header], worker, _TAG_HEADER).wait(self.job.timeout)
                if int(header[1]) == _LEAVE:
                    server.leave(worker)
                    return
                self._receive_push(worker, header)
            except Exception as exc:
                if isinstance(exc, DeathDuringCall) or self._reported_dead(worker):
                    return  # rank 0's loop drops it (_drop_the_dead)
                with server.cond:
                    server.error = (f"parameter server on rank 0 stopped receiving from worker {worker}: "
                                    f"{str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}")
                    server.cond.notify_all()
                return

    def _reported_dead(self, worker: int, within_s: float = 3.0) -> bool:
        """Whether the launcher reports ``worker`` dead within ``within_s`` (a lost peer shows before its death does)."""
        deadline = time.monotonic() + within_s
        while worker not in set(self.dead_workers()):
            if time.monotonic() > deadline:
                return False
            time.sleep(_POLL_S)
        return True

    def _raise_server_error(self) -> None:
        if self._server is not None and self._server.error:
            raise WorkerError(self._server.error)

    # -- leaving -------------------------------------------------------------
    def should_stop(self, local_done: bool) -> bool:
        self._raise_server_error()
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
            self._send(torch.tensor([job.rank, _LEAVE, self.stats.iterations, 0, 0], dtype=torch.int64), _TAG_HEADER)
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
            self.stats.extra.update(answers_in_flight_max=self._server.answers_in_flight_max())
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
        server, seen, deadline = self._server, -1, time.monotonic() + self.job.timeout_s
        while self._thread.is_alive() and server.logic.active():
            self._drop_the_dead()
            self._thread.join(_POLL_S)
            if server.messages != seen:
                seen, deadline = server.messages, time.monotonic() + self.job.timeout_s
            elif time.monotonic() > deadline:
                missing = sorted(server.logic.active())
                raise WorkerError(f"worker 0 waited {self.job.timeout_s:.0f} s for workers {missing} to leave")
        self._raise_server_error()
        with server.cond:
            server.close(drain=True)

    def _release(self) -> None:
        if self._server is not None:
            self._server.close(drain=False)
        self._up = self._down = None

    def _extra_state(self) -> dict:
        if self._server is None:
            return {}
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


document_settings(ParameterServer, PSOptions)
