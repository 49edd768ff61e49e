"""Prague (Luo et al., ASPLOS'20) on torch.distributed: local step, ask the Group Generator, P-Reduce, repeat.

    with hetrain.Prague(model, optimizer, gg="smart", group_size=2) as sync:
        for x, y in batches:
            ...forward, backward...
            optimizer.step()          # then: ask the GG, run the groups it returns, in order

:class:`GroupProtocol` is the shell shared with AD-PSGD: it asks a
:class:`~hetrain.protocols.ledger.GroupScheduler` (served beside rank 0 by
:mod:`hetrain.groups.gg_service`, or computed locally for the static
schedule) for groups and runs them with :class:`~hetrain.groups.preduce.PReduce`.
Reasons behind the design are in ``docs/concepts/prague.md``.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from hetrain.comm.settings import CommSettings
from hetrain.compression.codecs import make_codec
from hetrain.compression.spec import CompressionSpec
from hetrain.errors import UsageError, WorkerError
from hetrain.groups.background_average import BackgroundAverage
from hetrain.groups.gg_prefetch import GroupPrefetch
from hetrain.groups.gg_service import GGServer, LocalClient, SchedulerHost, SocketClient
from hetrain.groups.preduce import MemberDied, PReduce
from hetrain.protocols.ledger import GroupScheduler
from hetrain.protocols.options import options_or_settings
from hetrain.protocols.prague_options import PragueOptions, scheduler_for
from hetrain.protocols.request_timing import ComputeEstimate, ask_after_s
from hetrain.runtime.consensus import average_state, freeze_membership
from hetrain.runtime.flat_state import averaged_nbytes
from hetrain.runtime.protocol import SyncProtocol, comm_from
from hetrain.runtime.public_signature import document_settings, keywords_given
from hetrain.transport.device_thread import wait_work
from hetrain.transport.job import DEFAULT_TIMEOUT_S
from hetrain.transport.link_spec import LinkSpec

_STATUS_POLL_S = 0.02


def fit_to_memory(options, model, comm: CommSettings, nccl: bool, num_workers: int | None = None):
    """``options`` with the communicator cache sized to ``comm_memory_mb`` for ``model`` and the
    communication settings ``comm`` (:mod:`hetrain.protocols.comm_budget`). The launcher serving the
    Group Generator computes the same (``hetrain.jobs.run``): every worker's cache and the GG's mirror of
    it keep the same number of member sets."""
    return options.fit_memory(averaged_nbytes(model, anchors=comm.outer_named != "none"),
                              compressed=comm.compression.enabled, nccl=nccl, num_workers=num_workers)


def _nccl(process_group) -> bool:
    return dist.is_initialized() and str(dist.get_backend(process_group)).lower() == "nccl"


class GroupProtocol(SyncProtocol):
    """Runs the groups a scheduler hands out; leaves cleanly and ends on the consensus model."""

    name = "group"
    outer_gossips_anchors = True  # the groups change every exchange: combine, then adapt (runtime/outer_step.py)

    def __init__(self, model, optimizer, scheduler: GroupScheduler, *, communicator_cache: int,
                 local_scheduler: bool, process_group, timeout_s: float, on_failure: str = "abort",
                 dead_workers=None, gg_address: tuple[str, str] | None = None, gg_prefetch_ms: float = 0.0,
                 preduce_overlap: bool = False, options=None, comm: CommSettings | None = None, transport=None):
        super().__init__(model, optimizer, options=options, comm=comm, process_group=process_group,
                         timeout_s=timeout_s, on_failure=on_failure, dead_workers=dead_workers, transport=transport)
        job = self.job
        if job.store is None and job.world_size > 1:
            raise UsageError(f"{self.name} needs the job's c10d store (torch.distributed initialised)")
        self.scheduler = scheduler
        is_dead = (lambda rank: rank in self.dead or rank in self.dead_workers() or self._replaced(rank)) \
            if self.dead_workers else None
        self._running = None  # the group being reduced now (respawn: a member replaced since is gone)
        # the anchors beside the model (an outer optimizer: combine, then adapt) go one bit a value, as Hop's
        # mixed momentum does (docs/decisions/anchors-one-bit-a-value.md)
        codec = make_codec(self.compression, self.state.numel, [tuple(t.shape) for t in self.state.tensors],
                           head=self.state.model_numel) if self.compression.enabled else None
        self.preduce = PReduce(job.store, job.rank, cache_size=communicator_cache, timeout_s=job.timeout_s,
                               is_dead=is_dead, link=self.link, codec=codec, gossip_step=self.gossip_step,
                               backend=job.backend)
        self._server = None
        self._groups_failed = 0
        self._local = local_scheduler or job.world_size == 1
        if self._local:
            self.gg = LocalClient(job.rank, SchedulerHost(scheduler))
        elif gg_address is not None:  # served by the launcher: no worker's death takes it down
            self.gg = SocketClient.to(job.rank, *gg_address, timeout_s=job.timeout_s)
        elif job.rank == 0:
            self._server = GGServer(scheduler, multi_node=job.multi_node)
            self._server.publish(job.store)
            self.gg = LocalClient(0, self._server)
        else:
            self.gg = SocketClient(job.rank, job.store, job.timeout_s)
        if isinstance(self.gg, SocketClient):  # requests and answers pay the emulated network
            self.gg.link, self.gg.server_rank = self.link, None if gg_address is not None else 0
        # ask the GG before the compute ends (not for a local schedule: no round trip to hide)
        self._lead_ms = gg_prefetch_ms
        self._prefetch = None if self._local or gg_prefetch_ms <= 0 else \
            GroupPrefetch(self.gg.request, f"worker {job.rank}", job.timeout_s)
        self._compute = ComputeEstimate()
        # run a step's P-Reduces while the next step computes (not for a replacement's first groups)
        self._background = BackgroundAverage(self._reduce, f"worker {job.rank}", job.timeout_s, job.device) \
            if preduce_overlap else None
        self._groups_run = 0
        self._members_run = 0
        self._empty_syncs = 0
        self._groups_this_sync = False
        self._gg_wait_s = 0.0
        self._member_wait_s = 0.0
        self._settled = not self.joining  # a replacement counts in averages once it holds a model
        self._update_extra()
        if self.joining:
            self._adopt_model()
        self.restart_clock()

    def _adopt_model(self) -> None:
        """A replacement: announce itself (the launcher re-admits it to the Group Generator), then run
        groups until one has handed it the others' average (it is *fresh* in them: weight zero)."""
        self._announce_joined()
        deadline = time.monotonic() + self.job.timeout_s
        while not self._settled:
            if time.monotonic() > deadline:
                raise WorkerError(f"worker {self.job.rank} (a replacement) got no model from a group within "
                                  f"{self.job.timeout_s:.0f} s")
            groups = self.gg.request()
            if groups:
                self._run(groups, self._group_weight())
            else:
                time.sleep(_STATUS_POLL_S)
        self.stats.extra["joined_at_iteration"] = self.stats.iteration
        self._announce_settled()

    # -- the loop --------------------------------------------------------------
    def _apply_background(self) -> None:
        """Wait for the previous step's background averages (if any) and apply them to the model (through
        the outer optimizer, if there is one: the exchange's outer step lands with its average)."""
        if self._background is not None and self._background.pending:
            flat = self.state.gather()
            self._background.finish(flat, self._outer.transform if self._outer is not None else None)
            self.state.scatter(flat)

    def _outer_step_delayed(self) -> bool:
        return self._background is not None

    def _averaged(self) -> bool:
        return self._groups_this_sync

    def should_stop(self, local_done: bool) -> bool:
        """Each worker stops on its own (``finish`` drains); a stopping worker's model gets its last averages
        at once, so what the loop sees after it (e.g. an evaluation before ``finish``) includes them."""
        stop = self._stop_wanted(local_done)
        if stop:
            self._apply_background()
        return stop

    def _stop_wanted(self, local_done: bool) -> bool:
        return bool(local_done)

    def _sync(self) -> None:
        self._apply_background()  # the previous step's averages
        start = time.perf_counter()
        prefetch = self._prefetch
        groups = prefetch.take() if prefetch is not None and prefetch.pending else self.gg.request()
        self._gg_wait_s += time.perf_counter() - start
        weight = self._group_weight()
        self._groups_this_sync = bool(groups)  # with overlap: the outer step lands with the average, if any ran
        if groups and self._background is not None:
            self._background.start(self.state.gather(), groups, weight)
        elif groups:
            self._groups_this_sync = self._run(groups, weight) > 0  # no outer step where every group failed
        else:
            self._empty_syncs += 1
        if prefetch is not None:
            self._compute.add(start - self._last_exchange_end)  # the local steps since the last exchange
            prefetch.schedule(time.perf_counter() + ask_after_s(self._compute.value, self._lead_ms))
        self._update_extra()

    def _group_weight(self) -> float | None:
        """This worker's weight in its groups' averages: its local steps under ``local_work="auto"``.
        Every call site passes it: a member passing none where another passes one breaks the collective."""
        return self.steps_this_exchange if self.local_work == "auto" else None

    def _run(self, groups, weight: float | None = None) -> int:
        flat = self.state.gather()
        ran = self._reduce(flat, groups, weight)
        self.state.scatter(flat)
        return ran

    def _reduce(self, flat, groups, weight: float | None = None) -> int:
        """Average ``flat`` in place over ``groups``, in order (on the worker's thread, or a background one);
        ``weight``: this worker's weight in each (``local_work="auto"``: its local steps). Returns how many
        groups ran (a group with a dead or replaced member is skipped: no average, so no outer step)."""
        ran = 0
        for group in groups:
            if self.on_failure == "respawn" and self._formed_before_a_replacement(group):
                self.preduce.skip(group.members, group.comm_id)  # a member's process has been replaced since
                self._groups_failed += 1
                continue
            start = time.perf_counter()
            self._running = group
            try:
                self.preduce(flat, group.members, group.comm_id, group.fresh, weight)
            except MemberDied as exc:  # continue mode: the group's model average is lost, the job is not
                self.dead.update(exc.dead)
                self._groups_failed += 1
                continue
            finally:
                self._running = None
                self._member_wait_s += time.perf_counter() - start
            self._groups_run += 1
            ran += 1
            self._members_run += len(group.members)
            if not self._settled and self.job.rank in group.fresh:
                self._settled = True  # it holds the others' average now
                self.gg.call("settled")
        return ran

    def _replaced(self, rank: int) -> bool:
        """Respawn: whether ``rank``'s process in the group being reduced has been replaced since the
        group was formed. Its replacement never runs that group, and the launcher counts the rank
        alive again once the replacement joins, which can be before a member waiting in the group
        gives up (its wait is one timeout long): without this, that wait would end in an error."""
        group = self._running
        return self._membership is not None and group is not None and rank in group.members and \
            self._membership.incarnations()[rank] != group.incarnation_of(rank)

    def _formed_before_a_replacement(self, group) -> bool:
        """Whether a member of ``group`` has been replaced since the group was formed (respawn)."""
        self.new_deaths()
        self.rejoined()
        return any(group.incarnation_of(m) != self.incarnations[m] for m in group.members if m != self.job.rank)

    # -- leaving -----------------------------------------------------------------
    def _finish(self) -> None:
        """Leave the GG, run the groups still owed, wait for all to leave, average over everyone."""
        self._apply_background()
        owed = self._prefetch.withdraw() if self._prefetch is not None else []
        owed = owed + self.gg.leave()
        if owed:
            self._run(owed, self._group_weight())  # weighted as its members' syncs weigh theirs
        if self.job.world_size > 1:
            freeze_membership(self.job, self.dead_workers, "the final average")  # before waiting for anyone
            if not self._local:
                self._wait_all_left()
            self.stats.extra["consensus_distance"] = average_state(self.state, self.job, self.dead_workers,
                                                                   self._beacon)
        if self._server is not None:
            self.stats.extra.update(self.scheduler.stats())
        self._update_extra()

    def _worker_left(self, rank: int) -> None:
        if self._server is not None:  # this process serves the Group Generator
            self._server.handle({"op": "leave", "worker": rank})

    def _release(self) -> None:
        if self._prefetch is not None:
            self._prefetch.close()
        if self._server is not None:
            self._server.close()
        self.gg.close()

    def _wait_all_left(self) -> None:
        """Poll the GG until every worker has left; fail only after ``timeout_s`` without GG activity."""
        served, deadline = -1, time.monotonic() + self.job.timeout_s
        while True:
            status = self.gg.status()
            left = set(status["left"])
            if len(left) == self.job.world_size:
                return
            if status["served"] != served:
                served, deadline = status["served"], time.monotonic() + self.job.timeout_s
            if time.monotonic() > deadline:
                missing = sorted(set(range(self.job.world_size)) - left)
                raise WorkerError(
                    f"worker {self.job.rank} waited {self.job.timeout_s:.0f} s (no Group Generator activity) "
                    f"for workers {missing} to leave the training loop"
                )
            time.sleep(_STATUS_POLL_S)

    def _update_extra(self) -> None:
        self.stats.extra.update(
            groups_formed=self._groups_run,
            groups_failed=self._groups_failed,
            mean_group_size=self._members_run / self._groups_run if self._groups_run else 0.0,
            empty_syncs=self._empty_syncs,
            gg_wait_s=self._gg_wait_s,
            member_wait_s=self._member_wait_s,
            gg_requests_early=self._prefetch.sent_early if self._prefetch is not None else 0,
            **({"overlap_wait_s": self._background.wait_s, "overlapped_syncs": self._background.started}
               if self._background is not None else {}),
            comm_cache_entries=self.preduce.cache.capacity,
            uncompressed_bytes=self.preduce.uncompressed_bytes,
            compressed_bytes=self.preduce.compressed_bytes,
            **self.preduce.stats(),
        )


class Prague(GroupProtocol):
    """Prague: after each local step a group (from the Group Generator, mode ``gg``) averages its models.

    Its settings are :class:`~hetrain.protocols.prague_options.PragueOptions`' fields, given by
    keyword (defaults there) or as one ``options=PragueOptions(...)``:
    ``gg``: ``smart`` (heterogeneity-aware, the default), ``random``, ``buffer``,
    ``division`` or ``static``; ``group_size``: members per group (2 by default,
    docs/concepts/prague.md); ``communicator_cache``: communicators kept per worker, at most
    as many as ``comm_memory_mb`` holds (compressed copies, NCCL communicators:
    :mod:`~hetrain.protocols.comm_budget`);
    ``workers_per_node``: node size for the node-aware static schedule;
    ``gg_prefetch_ms``: ask the GG this long before the compute is expected to
    end, hiding the round trip (0: ask after it; :mod:`~hetrain.groups.gg_prefetch`);
    ``preduce_overlap=1`` (default) runs a step's P-Reduces on a thread while
    the next step computes, applying the average one step late (0: block on them)
    (:mod:`~hetrain.groups.background_average`); ``gg_shards``/``gg_epoch_s``:
    that many Group Generators, each over a shard
    of the workers redrawn every ``gg_epoch_s`` seconds
    (:mod:`~hetrain.protocols.sharded_gg`); ``seed``:
    the GG's random draws (the same on every worker). ``gg_address=(host:port,
    secret)`` uses a Group Generator served elsewhere (the local launcher serves
    one, so no worker's death takes it down); otherwise rank 0 serves it.

    Example::

        with hetrain.Prague(model, optimizer, gg="smart", group_size=2) as sync:
            for x, y in loader:
                optimizer.zero_grad(); loss_fn(model(x), y).backward(); optimizer.step()
        print(sync.metrics()["groups_formed"])
    """

    name = "prague"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                 gg: str = PragueOptions.gg, group_size: int = PragueOptions.group_size,
                 communicator_cache: int = PragueOptions.communicator_cache,
                 comm_memory_mb: int = PragueOptions.comm_memory_mb,
                 workers_per_node: int | None = PragueOptions.workers_per_node,
                 gg_prefetch_ms: float = PragueOptions.gg_prefetch_ms, gg_shards: int = PragueOptions.gg_shards,
                 gg_epoch_s: float = PragueOptions.gg_epoch_s, preduce_overlap: int = PragueOptions.preduce_overlap,
                 sync_every: int = CommSettings.sync_every, local_work: str = CommSettings.local_work,
                 outer_optimizer: str | torch.optim.Optimizer = CommSettings.outer_optimizer,
                 outer_lr: float | None = CommSettings.outer_lr, outer_momentum: float | None = CommSettings.outer_momentum,
                 compression: str | CompressionSpec = CommSettings.compression,
                 gossip_step: float | None = CommSettings.gossip_step, link_mbps: str | None = CommSettings.link_mbps,
                 link_latency_ms: str | None = CommSettings.link_latency_ms, link: LinkSpec | str | float | None = None,
                 options: PragueOptions | None = None, comm: CommSettings | None = None, seed: int = 0,
                 process_group=None, timeout_s: float = DEFAULT_TIMEOUT_S, on_failure: str = "abort",
                 dead_workers=None, gg_address: tuple[str, str] | None = None, transport=None):
        settings = keywords_given(locals(), PragueOptions)
        comm = comm_from(comm, settings, "Prague")
        options = options_or_settings(PragueOptions, options, settings, "Prague")
        world = transport.job.world_size if transport is not None else \
            dist.get_world_size(process_group) if dist.is_initialized() else 1
        fitted = fit_to_memory(options, model, comm, transport.job.nccl if transport is not None else
                               _nccl(process_group), world)  # the cache sized to comm_memory_mb
        scheduler = scheduler_for(world, fitted, seed)
        options.check_on_failure(on_failure)
        self.gg_mode = options.gg
        super().__init__(model, optimizer, scheduler, communicator_cache=fitted.communicator_cache,
                         local_scheduler=options.local_schedule, process_group=process_group, timeout_s=timeout_s,
                         on_failure=on_failure, dead_workers=dead_workers, gg_address=gg_address,
                         gg_prefetch_ms=options.gg_prefetch_ms, preduce_overlap=bool(options.preduce_overlap),
                         options=options, comm=comm, transport=transport)
        self.stats.extra["gg_mode"] = options.gg

    def _checkpoint_due(self, wish: bool) -> bool:
        """The static schedule with local steps: only at an exchange. Its workers must reach their k-th
        exchange at the same step of a run, and a resume counts a run's steps afresh: a checkpoint written
        mid-interval, at a different local step on each worker, put them out of step after ``--resume``
        (one in a P-Reduce, its partner at the stop vote: both waited out the timeout). An average still
        running in the background (overlap) lands first: the checkpoint is written from the model, and a
        resumed worker has no average in flight (it was lost at every checkpoint)."""
        due = wish and not (self.options.local_schedule and self._local_steps)
        if due:
            self._apply_background()
        return due

    def _load_extra_state(self, state: dict) -> None:
        """The static schedule: every worker goes on from the lowest iteration any worker's file holds (a
        collective: every worker loads its state at the same point). Each writes its file on its own timer, so
        a kill can leave files of different exchanges; the workers then leave together at the first stop vote
        any wants, and one that went on from an older file ended short of ``--iterations``
        (docs/decisions/known-limits.md)."""
        if not self.options.local_schedule or self.job.world_size == 1:
            return
        self.stats.iteration = self._lowest_of_workers(self.stats.iteration, "resumed iteration")

    def _stop_wanted(self, local_done: bool) -> bool:
        """GG modes: each worker stops on its own (``finish`` drains). Static: agree at period boundaries.

        The static schedule has no GG to tell who left, so every ``period``
        steps the workers all-reduce their wish to stop (MAX) and leave
        together at the first boundary where anyone wants to. The vote is a collective on the world group
        and a background P-Reduce (``preduce_overlap``) one on a group's communicator: the previous step's
        averages are applied first, so every rank runs its P-Reduces, then the vote, in one order (two
        communicators in flight in different orders on different ranks can deadlock NCCL).
        """
        if not self.options.local_schedule or self.job.world_size == 1:
            return bool(local_done)
        if self.stats.iterations % self.scheduler.period:
            return False
        self._apply_background()
        flag = torch.tensor([1.0 if local_done else 0.0], device=self.job.device)
        try:
            wait_work(self.job.all_reduce(flag, dist.ReduceOp.MAX), self.job.timeout, self.job.nccl, "the stop vote")
        except Exception as exc:
            raise WorkerError(
                f"worker {self.job.rank} waited for the static schedule's stop vote at step "
                f"{self.stats.iterations}: {exc}"
            ) from None
        self._pay_vote(flag.numel() * flag.element_size())
        return bool(flag.item() > 0)


document_settings(Prague, PragueOptions)
