"""A parameter-server baseline: the global model lives on rank 0.

After each local step a worker pushes its *delta* (its model minus the model
it last pulled) and gets the global model back.

- Synchronous (``staleness=0``): the server waits for one delta from every
  worker still training, adds their mean, and answers them all (BSP).
- Asynchronous (``staleness=s > 0``): the server adds each delta, scaled by
  1/n so the step size matches the synchronous mean, as it arrives, and
  answers at once unless the pusher would be more than s pushes ahead of the
  slowest worker still training (stale-synchronous parallel); then its answer
  waits until the slowest catches up or leaves.

Rank 0 is also a worker: its pushes go to the server state in-process; a
thread on rank 0 receives the others' messages over a dedicated gloo group
(one for requests, one for answers, so the thread's receive never blocks a
send). A worker that stops sends ``leave`` and is no longer waited for; when
all have left, rank 0 broadcasts the global model so every worker ends with it.
"""

from __future__ import annotations

import datetime
import threading
import time

import torch
import torch.distributed as dist

from hetrain.errors import UsageError, WorkerError
from hetrain.runtime.protocol import SyncProtocol, flat_parameters, load_flat_parameters
from hetrain.runtime.send_window import SendWindow

_PUSH, _LEAVE = 0, 1
_TAG_HEADER, _TAG_DELTA, _TAG_REPLY = 1, 2, 3
_POLL_S = 0.02
# A worker waits for its answer before it pushes again, so at most one answer per worker is in
# flight: a window of 2 never blocks a healthy job and bounds the memory of a broken one.
_ANSWERS_IN_FLIGHT = 2


class _ServerState:
    """The global model and who waits for what; every method runs under ``cond``."""

    def __init__(self, model: torch.Tensor, num_workers: int, staleness: int, down, timeout_s: float):
        self.model = model
        self.n = num_workers
        self.staleness = staleness
        self.down = down
        self.timeout_s = timeout_s
        self.cond = threading.Condition()
        self.pushes = [0] * num_workers
        self.left: set[int] = set()
        self.round: dict[int, torch.Tensor] = {}
        self.deferred: list[int] = []
        self.local_reply: torch.Tensor | None = None
        self.messages = 0
        self.error: str | None = None
        self._windows: dict[int, SendWindow] = {}  # answers in flight, per worker

    def push(self, worker: int, delta: torch.Tensor) -> None:
        with self.cond:
            self.messages += 1
            self.pushes[worker] += 1
            if self.staleness == 0:
                self.round[worker] = delta
                self._finish_round()
            else:
                self.model.add_(delta, alpha=1.0 / self.n)
                self.deferred.append(worker)
                self._release()

    def leave(self, worker: int) -> None:
        with self.cond:
            self.messages += 1
            self.left.add(worker)
            if self.staleness == 0:
                self._finish_round()
            else:
                self._release()
            self.cond.notify_all()

    def _active(self) -> set[int]:
        return set(range(self.n)) - self.left

    def _finish_round(self) -> None:
        if not self.round or not self._active() <= set(self.round):
            return
        self.model.add_(torch.stack(list(self.round.values())).mean(dim=0))
        waiting = sorted(self.round)
        self.round.clear()
        for worker in waiting:
            self._answer(worker)

    def _release(self) -> None:
        active = self._active()
        slowest = min((self.pushes[w] for w in active), default=0)
        still = []
        for worker in self.deferred:
            if worker in self.left or self.pushes[worker] - slowest <= self.staleness:
                self._answer(worker)
            else:
                still.append(worker)
        self.deferred = still

    def _answer(self, worker: int) -> None:
        reply = self.model.clone()
        if worker == 0:
            self.local_reply = reply
            self.cond.notify_all()
            return
        window = self._windows.get(worker)
        if window is None:
            window = self._windows[worker] = SendWindow("the parameter server (rank 0)", worker,
                                                        max_in_flight=_ANSWERS_IN_FLIGHT, timeout_s=self.timeout_s)
        window.post(lambda: [self.down.send([reply], worker, _TAG_REPLY)], reply)

    def answers_in_flight_max(self) -> int:
        """The most answers ever outstanding to one worker."""
        return max((w.max_seen_in_flight for w in self._windows.values()), default=0)

    def wait_sends(self) -> None:
        for window in self._windows.values():
            window.drain()
            window.close()


class ParameterServer(SyncProtocol):
    name = "ps"

    def __init__(self, model, ctx, *, staleness: int = 0):
        super().__init__(model, ctx)
        if staleness < 0:
            raise UsageError(f"--staleness must be >= 0, got {staleness}")
        if ctx.world_size > 1 and ctx.store is None:
            raise UsageError("ps needs the job's c10d store (WorkerContext.store)")
        self.staleness = staleness
        self._timeout = datetime.timedelta(seconds=ctx.timeout_s)
        self._state: _ServerState | None = None
        self._thread: threading.Thread | None = None
        self._finished = False
        n = ctx.world_size
        flat = flat_parameters(model)
        if n > 1:
            self._collective(dist.broadcast(flat, src=0, async_op=True), "the initial model from rank 0")
            load_flat_parameters(model, flat)
            self._up = dist.ProcessGroupGloo(dist.PrefixStore("ps/up/", ctx.store), ctx.rank, n, self._timeout)
            self._down = dist.ProcessGroupGloo(dist.PrefixStore("ps/down/", ctx.store), ctx.rank, n, self._timeout)
        else:
            self._up = self._down = None
        self._pulled = flat.detach().cpu().clone()
        if ctx.rank == 0:
            self._state = _ServerState(self._pulled.clone(), n, staleness, self._down, ctx.timeout_s)
            self._thread = threading.Thread(target=self._serve, name="hetrain-ps", daemon=True)
            self._thread.start()
        self.stats.extra.update(ps_mode="sync" if staleness == 0 else f"async(staleness={staleness})")

    @classmethod
    def from_config(cls, model, ctx, config) -> ParameterServer:
        return cls(model, ctx, staleness=config.staleness or 0)

    # -- worker side ---------------------------------------------------------
    def _sync(self) -> None:
        delta = flat_parameters(self.model).cpu() - self._pulled
        if self.ctx.rank == 0:
            reply = self._push_local(delta)
        else:
            header = torch.tensor([self.ctx.rank, _PUSH, self.stats.iterations], dtype=torch.int64)
            self._send(header, _TAG_HEADER)
            self._send(delta, _TAG_DELTA)
            reply = torch.empty_like(delta)
            self._collective(self._down.recv([reply], 0, _TAG_REPLY), f"the server's answer to push {self.stats.iterations}")
        self._pulled = reply
        load_flat_parameters(self.model, reply.to(self.ctx.device))
        self.stats.iteration = self.stats.iterations

    def _push_local(self, delta: torch.Tensor) -> torch.Tensor:
        state = self._state
        state.push(0, delta)
        with state.cond:
            if not state.cond.wait_for(lambda: state.local_reply is not None or state.error, self.ctx.timeout_s):
                waiting = sorted(state._active() - set(state.round)) if self.staleness == 0 else "the slowest"
                raise WorkerError(f"worker 0 waited {self.ctx.timeout_s:.0f} s for the server to answer (waiting for {waiting})")
            self._raise_server_error()
            reply, state.local_reply = state.local_reply, None
        return reply

    def _send(self, tensor: torch.Tensor, tag: int) -> None:
        self._collective(self._up.send([tensor], 0, tag), "the parameter server (rank 0) to take its message")

    def _collective(self, work, what: str) -> None:
        try:
            work.wait(self._timeout)
        except Exception as exc:
            raise WorkerError(f"worker {self.ctx.rank} waited {self.ctx.timeout_s:.0f} s for {what}: {exc}") from None

    # -- server thread (rank 0) ----------------------------------------------
    def _serve(self) -> None:
        state = self._state
        remote_left = 0
        header = torch.zeros(3, dtype=torch.int64)
        try:
            while remote_left < self.ctx.world_size - 1:
                self._up.recv_anysource([header], _TAG_HEADER).wait(self._timeout)
                worker, kind, _ = (int(v) for v in header)
                if kind == _LEAVE:
                    remote_left += 1
                    state.leave(worker)
                    continue
                delta = torch.empty_like(self._pulled)
                self._up.recv([delta], worker, _TAG_DELTA).wait(self._timeout)
                state.push(worker, delta)
        except Exception as exc:
            with state.cond:
                state.error = f"parameter server on rank 0 stopped: {exc}"
                state.cond.notify_all()

    def _raise_server_error(self) -> None:
        if self._state is not None and self._state.error:
            raise WorkerError(self._state.error)

    # -- leaving -------------------------------------------------------------
    def should_stop(self, local_done: bool) -> bool:
        self._raise_server_error()
        return super().should_stop(local_done)

    def finish(self) -> None:
        """Leave; when every worker has left, rank 0 broadcasts the global model to all."""
        if self._finished:
            return
        self._finished = True
        n, rank = self.ctx.world_size, self.ctx.rank
        if rank == 0:
            self._state.leave(0)
            self._join_server()
            final = self._state.model.clone()
        else:
            self._send(torch.tensor([rank, _LEAVE, self.stats.iterations], dtype=torch.int64), _TAG_HEADER)
            final = torch.empty_like(self._pulled)
        if n > 1:
            final = final.to(self.ctx.device)
            self._collective(dist.broadcast(final, src=0, async_op=True), "the final model from rank 0")
        load_flat_parameters(self.model, final)
        self.stats.extra.update(pushes=self.stats.iterations)
        if self._state is not None:
            self.stats.extra.update(answers_in_flight_max=self._state.answers_in_flight_max())

    def _join_server(self) -> None:
        state, seen, deadline = self._state, -1, time.monotonic() + self.ctx.timeout_s
        while self._thread.is_alive():
            self._thread.join(_POLL_S)
            if state.messages != seen:
                seen, deadline = state.messages, time.monotonic() + self.ctx.timeout_s
            elif time.monotonic() > deadline:
                missing = sorted(state._active())
                raise WorkerError(f"worker 0 waited {self.ctx.timeout_s:.0f} s for workers {missing} to leave")
        self._raise_server_error()
        with state.cond:
            state.wait_sends()
