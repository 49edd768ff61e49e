"""What every synchronization protocol shares: the PyTorch-facing API and the step/finish template.

A protocol wraps a model (and optionally its optimizer) like torch's own
averagers do, and synchronizes after every optimizer step::

    with hetrain.Hop(model, optimizer, topology="ring") as sync:   # process_group=None: the world
        for x, y in batches:
            loss = loss_fn(model(x), y)
            optimizer.zero_grad(); loss.backward()
            optimizer.step()                  # the step post-hook runs sync.step(): send, wait, average
    # leaving the block: drain, average over all workers (every worker ends with the consensus
    # model), release threads, sockets and groups; on an exception only the release

Without an optimizer, call ``sync.step()`` after each of your own updates.
``should_stop(local_done)`` says when to leave a loop whose workers may stop at
different times (All-Reduce's workers must agree; the others stop on their own).

Timing: the time between two ``step`` calls is compute, the time inside is
waiting (communication the protocol could not hide); ``restart_clock()`` marks
the start of the first iteration's compute (default: the end of construction).
Subclasses implement ``_sync`` and, where they hold resources, ``_finish``,
``_release`` and ``_extra_state``/``_load_extra_state``.

Failures: with ``on_failure="abort"`` (default) a lost peer fails the worker
with an error naming it. With ``"continue"``, ``dead_workers()`` (the local
launcher's record of who died) tells the protocol whom to route around:
Hop/D-PSGD repair their graph, Prague and AD-PSGD skip groups with the dead
(their Group Generator stops grouping them), the parameter server stops
waiting for them; ``finish`` averages over the survivors. With
``"respawn"`` the same happens, and a dead worker's replacement (a new
process for the same rank, one *incarnation* later) joins: ``rejoined()``
names ranks that came back, the protocols connect to their new process over
new communicators and hand them the model (Hop/D-PSGD: the neighbours' last
models; Prague/AD-PSGD: the newcomer's first groups average it in with weight
zero). A replacement's own protocol is built with ``joining`` true.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from hetrain.protocols.membership import ON_FAILURE
from hetrain.protocols.options import OptionError
from hetrain.runtime.flat_state import FlatState
from hetrain.runtime.job import DEFAULT_TIMEOUT_S, JobView, model_device


@dataclass
class ProtocolStats:
    """Counters every protocol reports (per worker); protocol-specific ones go in ``extra``."""

    iterations: int = 0  # iterations whose gradient this worker computed (in this run, by this process)
    iteration: int = 0  # the worker's iteration counter: one up per step (SyncProtocol.step), counting on
    # from a resumed or replaced predecessor's; Hop sets it from its logic (it jumps when Hop skips)
    skipped_iterations: int = 0
    compute_s: float = 0.0
    wait_s: float = 0.0
    updates_stale: int = 0
    updates_dropped: int = 0
    max_iteration_gap: int = 0
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        data = asdict(self)
        data.update(data.pop("extra"))
        return data


class SyncProtocol:
    """Base class; see the module docstring. ``name`` is the registry's protocol name."""

    name = "base"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                 process_group=None, timeout_s: float = DEFAULT_TIMEOUT_S, on_failure: str = "abort",
                 dead_workers: Callable[[], set[int]] | None = None):
        if on_failure not in ON_FAILURE:
            raise OptionError(f"{{on_failure}} must be one of {', '.join(ON_FAILURE)}, got {on_failure!r}")
        self.model = model
        self.on_failure = on_failure
        self.tolerant = on_failure != "abort"  # continue or respawn: route around the dead
        self.dead_workers = dead_workers if self.tolerant else None
        self.dead: set[int] = set()  # workers this one knows to be dead
        self.job = JobView.of(process_group, model_device(model), timeout_s, self.name)
        # respawn: each rank's process number as this worker knows it (the launcher's LauncherMembership)
        self._membership = self.dead_workers if hasattr(self.dead_workers, "incarnations") else None
        self.incarnations = self._membership.incarnations() if self._membership else [0] * self.job.world_size
        self.incarnation = self._membership.incarnation if self._membership else 0
        self.joining = self.incarnation > 0  # a replacement joining a running job
        if self.joining:  # the deaths so far (a rank dead now comes back as a rejoin)
            self.dead = set(self.dead_workers()) - {self.job.rank}
        self.state = FlatState(model)
        self.stats = ProtocolStats()
        self._hook = optimizer.register_step_post_hook(self._after_optimizer_step) if optimizer is not None else None
        self._finished = False
        self._released = False
        self._last_step_end = time.perf_counter()

    # -- the PyTorch-facing surface ---------------------------------------------------------
    @property
    def module(self) -> nn.Module:
        """The module to run forward on: the model itself (All-Reduce: DistributedDataParallel's wrapper)."""
        return self.model

    def __enter__(self) -> SyncProtocol:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.finish()
        else:
            self.close()
        return False

    def restart_clock(self) -> None:
        """Mark now as the start of the next iteration's compute (e.g. after a barrier)."""
        self._last_step_end = time.perf_counter()

    def step(self) -> None:
        """Synchronise after an optimizer step (called by the step post-hook when an optimizer was given)."""
        if self._finished:
            raise RuntimeError(f"{self.name}: step() after finish()")
        now = time.perf_counter()
        self.stats.compute_s += now - self._last_step_end
        self.stats.iterations += 1
        self.stats.iteration += 1  # the one place it counts; Hop's _sync overwrites it with its logic's
        self._sync()
        end = time.perf_counter()
        self.stats.wait_s += end - now
        self._last_step_end = end

    def should_stop(self, local_done: bool) -> bool:
        """Whether to leave the loop; ``local_done`` is this worker's own wish.

        Decentralized protocols let each worker stop on its own (``finish``
        drains); All-Reduce overrides this so its workers leave together.
        """
        return bool(local_done)

    def checkpoint_due(self, wish: bool) -> bool:
        """Whether to checkpoint now, given this worker's ``wish``. Workers checkpoint on their own,
        except where they must agree on the iteration (All-Reduce: at its stop votes)."""
        return wish

    def finish(self) -> None:
        """Drain what is in flight, leave every worker with the consensus model, release resources."""
        if self._finished:
            return
        self._finished = True
        try:
            self._finish()
        finally:
            self.close()

    def close(self) -> None:
        """Release threads, sockets and groups without waiting for anyone (also after an error)."""
        if self._released:
            return
        self._released = True
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._release()

    def metrics(self) -> dict:
        if self.dead:
            self.stats.extra["workers_known_dead"] = sorted(self.dead)
        pool = self.state.pool
        self.stats.extra.update(flat_buffers_reused=pool.reused, flat_buffers_allocated=pool.allocated)
        return self.stats.as_dict()

    def new_deaths(self) -> set[int]:
        """Deaths the launcher reported since the last call (continue mode; empty otherwise)."""
        if self.dead_workers is None:
            return set()
        new = set(self.dead_workers()) - self.dead - {self.job.rank}
        self.dead |= new
        return new

    def rejoined(self) -> set[int]:
        """Ranks whose replacement joined since the last call (respawn; empty otherwise).

        Also a rank that died and came back between two calls (never seen dead
        here): its incarnation went up, so its old process and communicators are gone.
        """
        if self._membership is None:
            return set()
        dead, now = self._membership(), self._membership.incarnations()
        back = {r for r in range(self.job.world_size)
                if r != self.job.rank and r not in dead and (r in self.dead or now[r] > self.incarnations[r])}
        for r in back:
            self.incarnations[r] = now[r]
        self.dead -= back
        if back:
            self.stats.extra["workers_rejoined_seen"] = self.stats.extra.get("workers_rejoined_seen", 0) + len(back)
        return back

    def inherit_iteration(self, iteration: int) -> None:
        """A replacement: go on counting from its predecessor's iteration (protocols that take the
        iteration from their neighbours, as Hop does, keep theirs)."""
        if self.joining and iteration > self.stats.iteration:
            self.stats.iteration = iteration

    def announce_joined(self) -> None:
        """A replacement: tell the launcher this process is ready to be talked to."""
        if self._membership is not None and self.joining:
            self._membership.announce_joined(self.job.timeout_s)

    def state_dict(self) -> dict:
        """The protocol's own state (counters and, per protocol, what resuming needs); not the model's."""
        return {"protocol": self.name, "iteration": self.stats.iteration, "iterations": self.stats.iterations,
                **self._extra_state()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("protocol") != self.name:
            raise ValueError(f"a {state.get('protocol')!r} state cannot be loaded into {self.name}")
        self.stats.iteration = int(state["iteration"])  # the counter goes on; ``iterations`` counts this run
        self.stats.extra["iterations_before_resume"] = int(state["iterations"])
        self._load_extra_state(state)

    # -- for subclasses -----------------------------------------------------------------------
    def _after_optimizer_step(self, optimizer, args, kwargs) -> None:
        self.step()

    def _sync(self) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        """Drain and reach consensus (collective: every worker calls it)."""

    def _release(self) -> None:
        """Free threads, sockets and groups; must not block on other workers."""

    def _extra_state(self) -> dict:
        return {}

    def _load_extra_state(self, state: dict) -> None:
        pass
