"""Hop and D-PSGD on torch.distributed: the pure HopWorker logic driven by real messages.

    sync = Hop(model, ctx, topology="ring", backup=1, staleness=1, max_ig=4, skip_threshold=2)
    while not sync.should_stop(local_done):
        ...forward, backward, optimizer.step()...
        sync.step()
    sync.finish()

Each ``step`` sends the model (tagged with the iteration) to the out-neighbours,
waits until the logic says enough in-neighbour updates are held, averages with
the renormalized weights, returns tokens, and then waits for the tokens (or
skips iterations) that let the next iteration start. Receiving runs on
background threads, sending is asynchronous, so communication overlaps compute.
"""

from __future__ import annotations

import threading
import time
import warnings

import torch
from torch import nn

from hetrain.errors import UsageError, WorkerError
from hetrain.protocols.hop_config import HopConfig, hop_config_for
from hetrain.protocols.hop_logic import AveragePlan, HopWorker
from hetrain.runtime.consensus import average_models
from hetrain.runtime.context import WorkerContext
from hetrain.runtime.peer_channels import STOP, TOKEN, UPDATE, PeerChannels
from hetrain.runtime.protocol import SyncProtocol, flat_parameters, load_flat_parameters
from hetrain.topology import Topology, make_topology


class Hop(SyncProtocol):
    """Queue-based decentralized training (Hop, ASPLOS'19) on a directed graph."""

    name = "hop"

    def __init__(self, model: nn.Module, ctx: WorkerContext, topology: str | Topology = "ring",
                 backup: int | None = None, staleness: int | None = None, max_ig: int | None = None,
                 skip_threshold: int | None = None, *, _config: HopConfig | None = None):
        """Settings left as None take Hop's defaults (``hop_config_for``); ``skip_threshold=0`` turns
        skipping off."""
        super().__init__(model, ctx)
        self.topology = topology if isinstance(topology, Topology) else make_topology(topology, ctx.world_size)
        if self.topology.num_workers != ctx.world_size:
            raise UsageError(
                f"topology has {self.topology.num_workers} workers but the job has {ctx.world_size}; they must match"
            )
        self.config = _config or hop_config_for(self.topology, backup, staleness, max_ig, skip_threshold)
        w = self.topology.mixing_matrix
        rank = ctx.rank
        self.logic = HopWorker(rank, {j: float(w[rank, j]) for j in self.topology.in_neighbors[rank]},
                               float(w[rank, rank]), self.topology.out_neighbors[rank], self.config)
        self._cond = threading.Condition()
        self._channel_errors: list[str] = []
        self._neighbors_stopped = False
        self._finished = False
        numel = sum(p.numel() for p in model.parameters())
        dtype = next(model.parameters()).dtype
        self.channels = PeerChannels(ctx, numel, dtype, self._on_message)
        try:
            self.channels.handshake(self.topology.out_neighbors[rank], self.topology.in_neighbors[rank])
        except RuntimeError as exc:
            raise WorkerError(str(exc)) from None
        self.channels.listen("update", self.topology.in_neighbors[rank])
        self.channels.listen("token", self.topology.out_neighbors[rank] if self.config.uses_tokens else [])

    @classmethod
    def from_config(cls, model, ctx, config):
        return cls(model, ctx, config.topology, config.backup, config.staleness, config.max_ig,
                   config.skip_threshold)

    @classmethod
    def check_config(cls, config) -> None:
        topology = make_topology(config.topology, config.num_workers)
        hop_config_for(topology, config.backup, config.staleness, config.max_ig, config.skip_threshold)

    # ----- receiver threads ------------------------------------------------------
    def _on_message(self, channel, src, kind, iteration, count, payload) -> None:
        with self._cond:
            if kind == UPDATE:
                self.logic.receive_update(src, iteration, payload)
            elif kind == TOKEN:
                self.logic.receive_tokens(src, count)
            elif kind == STOP and channel == "update":
                self.logic.sender_finished(src)
            elif kind == STOP:
                self.logic.token_source_finished(src)
            else:
                self._channel_errors.extend(self.channels.errors[len(self._channel_errors):])
            self._cond.notify_all()

    # ----- the protocol -------------------------------------------------------------
    def _wait(self, ready) -> bool:
        """Wait (holding the lock) until ``ready()``; False if stopped neighbours make it impossible."""
        deadline = time.monotonic() + self.ctx.timeout_s
        while not ready():
            if self._channel_errors:
                raise WorkerError(self._channel_errors[0])
            if self.logic.blocked_by_stopped_neighbors():
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerError(
                    f"worker {self.ctx.rank} waited {self.ctx.timeout_s:.0f} s for {self.logic.waiting_for()}"
                )
            self._cond.wait(timeout=min(remaining, 1.0))
        return True

    def _apply(self, plan: AveragePlan, own: torch.Tensor) -> None:
        mixed = own * plan.self_weight
        for term in plan.terms:
            mixed.add_(term.payload, alpha=term.weight)
        load_flat_parameters(self.model, mixed)
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
            self._apply(plan, flat_parameters(self.model))
            # out-neighbours may be waiting for a skipped iteration's model: send this one
            self.channels.send("update", self.logic.out_neighbors, UPDATE, self.logic.iteration - 1, 0,
                               flat_parameters(self.model))

    def start(self) -> None:
        if self._last_step_end is None:
            self._begin_iteration()
        super().start()

    def _sync(self) -> None:
        if self._neighbors_stopped:
            return
        own = flat_parameters(self.model)
        self.channels.send("update", self.logic.out_neighbors, UPDATE, self.logic.iteration, 0, own)
        with self._cond:
            if not self._wait(self.logic.ready_to_average):
                self._neighbors_stopped = True
                return
            plan = self.logic.complete()
        self._apply(plan, own)  # own is not modified: it may still be on its way to the neighbours
        self._begin_iteration()
        self.stats.iteration = self.logic.iteration

    def should_stop(self, local_done: bool) -> bool:
        self.start()
        return bool(local_done) or self._neighbors_stopped

    def finish(self) -> None:
        """Tell neighbours we stopped, wait for theirs, then average every worker's model."""
        if self._finished:
            return
        self._finished = True
        self.channels.send("update", self.logic.out_neighbors, STOP)
        self.channels.send("token", self.topology.in_neighbors[self.ctx.rank] if self.config.uses_tokens else [], STOP)
        try:
            self.channels.join()
            self.channels.flush()
            self.channels.close()
        except RuntimeError as exc:
            raise WorkerError(str(exc)) from None
        if self._channel_errors:
            raise WorkerError(self._channel_errors[0])
        self.stats.extra["consensus_distance"] = average_models(self.model, self.ctx.world_size, self.ctx.timeout_s)

    def metrics(self) -> dict:
        counters = self.logic.counters()
        self.stats.updates_stale = counters.pop("updates_stale")
        self.stats.updates_dropped = counters.pop("updates_dropped")
        self.stats.max_iteration_gap = counters.pop("max_iteration_gap")
        self.stats.skipped_iterations = counters.pop("skipped_iterations")
        self.stats.iteration = self.logic.iteration
        self.stats.extra.update(counters, sends_in_flight_max=self.channels.max_in_flight_seen())
        return super().metrics()


class DPSGD(Hop):
    """Standard decentralized training (D-PSGD, NeurIPS'17): every iteration waits for every
    in-neighbour's model of the same iteration and averages. Hop with no backup workers,
    no staleness and no tokens (the graph bounds the iteration gap)."""

    name = "dpsgd"

    def __init__(self, model: nn.Module, ctx: WorkerContext, topology: str | Topology = "ring"):
        super().__init__(model, ctx, topology, _config=HopConfig())

    @classmethod
    def from_config(cls, model, ctx, config):
        return cls(model, ctx, config.topology)

    @classmethod
    def check_config(cls, config) -> None:
        make_topology(config.topology, config.num_workers)
        ignored = [flag for flag, value in (("--backup", config.backup), ("--staleness", config.staleness),
                   ("--max-ig", config.max_ig), ("--skip-threshold", config.skip_threshold)) if value]
        if ignored:
            warnings.warn(f"dpsgd ignores {', '.join(ignored)} (Hop settings); use --protocol hop", stacklevel=2)
