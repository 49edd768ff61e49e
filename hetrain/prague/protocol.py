"""Prague (Luo et al., ASPLOS'20): local step, ask the Group Generator for a group, P-Reduce, repeat.

Usage inside a training loop (see :mod:`hetrain.runtime.protocol`)::

    sync = Prague(model, ctx, gg="smart", group_size=2)
    while not sync.should_stop(local_done=...):
        ...forward, backward, optimizer step...
        sync.step()          # ask the GG, run the groups it returns, in order
    sync.finish()            # leave, run the groups still owed, final average over all workers

:class:`GroupProtocol` is the shell shared with AD-PSGD: it asks a scheduler
(served by rank 0, or computed locally for the static schedule) for groups and
executes them with :class:`~hetrain.prague.preduce.PReduce`. Reasons behind
the design are in ``docs/prague.md``.
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

from hetrain.errors import UsageError, WorkerError
from hetrain.prague.gg_service import GGServer, LocalClient, SchedulerHost, SocketClient
from hetrain.prague.group_generator import GroupGenerator, validate_gg
from hetrain.prague.preduce import PReduce
from hetrain.runtime.consensus import average_models
from hetrain.runtime.protocol import SyncProtocol, flat_parameters, load_flat_parameters

_STATUS_POLL_S = 0.02


class GroupProtocol(SyncProtocol):
    """Runs the groups a scheduler hands out; leaves cleanly and ends on the consensus model."""

    name = "group"

    def __init__(self, model, ctx, scheduler, *, communicator_cache: int = 60, local_scheduler: bool = False):
        super().__init__(model, ctx)
        if ctx.store is None and ctx.world_size > 1:
            raise UsageError(f"{self.name} needs the job's c10d store (WorkerContext.store)")
        self.preduce = PReduce(ctx.store, ctx.rank, cache_size=communicator_cache, timeout_s=ctx.timeout_s)
        self._server = None
        self._local = local_scheduler or ctx.world_size == 1
        key = f"{self.name}/gg_address"
        if self._local:
            self.gg = LocalClient(ctx.rank, SchedulerHost(scheduler))
        elif ctx.rank == 0:
            self._server = GGServer(scheduler, multi_node=ctx.local_world_size < ctx.world_size)
            self._server.publish(ctx.store, key)
            self.gg = LocalClient(0, self._server)
        else:
            self.gg = SocketClient(ctx.rank, ctx.store, ctx.timeout_s, key)
        self._finished = False
        self._groups_run = 0
        self._members_run = 0
        self._empty_syncs = 0
        self._gg_wait_s = 0.0
        self._member_wait_s = 0.0
        self._update_extra()

    # -- the loop --------------------------------------------------------------
    def _sync(self) -> None:
        start = time.perf_counter()
        groups = self.gg.request()
        self._gg_wait_s += time.perf_counter() - start
        self.stats.iteration = self.stats.iterations
        if groups:
            self._run(groups)
        else:
            self._empty_syncs += 1
        self._update_extra()

    def _run(self, groups) -> None:
        flat = flat_parameters(self.model)
        for group in groups:
            start = time.perf_counter()
            self.preduce(flat, group.members, group.comm_id)
            self._member_wait_s += time.perf_counter() - start
            self._groups_run += 1
            self._members_run += len(group.members)
        load_flat_parameters(self.model, flat)

    # -- leaving -----------------------------------------------------------------
    def finish(self) -> None:
        """Leave the GG, run the groups still owed, wait for all to leave, average over everyone."""
        if self._finished:
            return
        self._finished = True
        owed = self.gg.leave()
        if owed:
            self._run(owed)
        if self.ctx.world_size > 1:
            if not self._local:
                self._wait_all_left()
            self._consensus()
        if self._server is not None:
            self.stats.extra.update(self._server.scheduler.stats())
            self._server.close()
        self.gg.close()
        self._update_extra()

    def _wait_all_left(self) -> None:
        """Poll the GG until every worker has left; fail only after ``timeout_s`` without GG activity."""
        served, deadline = -1, time.monotonic() + self.ctx.timeout_s
        while True:
            status = self.gg.status()
            left = set(status["left"])
            if len(left) == self.ctx.world_size:
                return
            if status["served"] != served:
                served, deadline = status["served"], time.monotonic() + self.ctx.timeout_s
            if time.monotonic() > deadline:
                missing = sorted(set(range(self.ctx.world_size)) - left)
                raise WorkerError(
                    f"worker {self.ctx.rank} waited {self.ctx.timeout_s:.0f} s (no Group Generator activity) "
                    f"for workers {missing} to leave the training loop"
                )
            time.sleep(_STATUS_POLL_S)

    def _consensus(self) -> None:
        """One all-reduce over the default group: every worker ends with the average model."""
        try:
            distance = average_models(self.model, self.ctx.world_size, self.ctx.timeout_s)
        except Exception as exc:
            raise WorkerError(
                f"worker {self.ctx.rank} waited for the final average over all {self.ctx.world_size} workers: {exc}"
            ) from None
        self.stats.extra["consensus_distance"] = distance

    def _update_extra(self) -> None:
        self.stats.extra.update(
            groups_formed=self._groups_run,
            mean_group_size=self._members_run / self._groups_run if self._groups_run else 0.0,
            empty_syncs=self._empty_syncs,
            gg_wait_s=self._gg_wait_s,
            member_wait_s=self._member_wait_s,
            **self.preduce.stats(),
        )


class Prague(GroupProtocol):
    """Prague with a Group Generator mode (``gg``) and group size s (``group_size``)."""

    name = "prague"

    def __init__(
        self,
        model,
        ctx,
        *,
        gg: str = "smart",
        group_size: int = 2,
        communicator_cache: int = 60,
        workers_per_node: int | None = None,
        seed: int = 0,
    ):
        validate_gg(ctx.world_size, group_size, gg, communicator_cache, workers_per_node)
        scheduler = GroupGenerator(
            ctx.world_size, group_size, gg, seed=seed, workers_per_node=workers_per_node, cache_size=communicator_cache
        )
        self.gg_mode = gg
        self._period = scheduler._static.period if gg == "static" else 0
        super().__init__(
            model, ctx, scheduler, communicator_cache=communicator_cache, local_scheduler=gg == "static"
        )
        self.stats.extra["gg_mode"] = gg

    @classmethod
    def from_config(cls, model, ctx, config) -> Prague:
        return cls(
            model,
            ctx,
            gg=config.gg,
            group_size=config.group_size,
            communicator_cache=config.communicator_cache,
            workers_per_node=config.workers_per_node,
            seed=config.seed,
        )

    @classmethod
    def check_config(cls, config) -> None:
        validate_gg(config.num_workers, config.group_size, config.gg, config.communicator_cache,
                    config.workers_per_node)

    def should_stop(self, local_done: bool) -> bool:
        """GG modes: each worker stops on its own (``finish`` drains). Static: agree at period boundaries.

        The static schedule has no GG to tell who left, so every ``period``
        steps the workers all-reduce their wish to stop (MAX) and leave
        together at the first boundary where anyone wants to.
        """
        self.start()
        if self.gg_mode != "static" or self.ctx.world_size == 1:
            return bool(local_done)
        if self.stats.iterations % self._period:
            return False
        flag = torch.tensor([1.0 if local_done else 0.0], device=self.ctx.device)
        try:
            work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True)
            work.wait(datetime.timedelta(seconds=self.ctx.timeout_s))
        except Exception as exc:
            raise WorkerError(
                f"worker {self.ctx.rank} waited for the static schedule's stop vote at step "
                f"{self.stats.iterations}: {exc}"
            ) from None
        return bool(flag.item() > 0)
