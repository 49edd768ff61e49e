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
waiting for them; ``finish`` averages over the survivors.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from hetrain.protocols.options import OptionError
from hetrain.runtime.flat_state import FlatState
from hetrain.runtime.job import DEFAULT_TIMEOUT_S, JobView, model_device


@dataclass
class ProtocolStats:
    """Counters every protocol reports (per worker); protocol-specific ones go in ``extra``."""

    iterations: int = 0  # iterations whose gradient this worker computed
    iteration: int = 0  # the worker's iteration counter (jumps when Hop skips)
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
        if on_failure not in ("abort", "continue"):
            raise OptionError(f"{{on_failure}} must be abort or continue, got {on_failure!r}")
        self.model = model
        self.on_failure = on_failure
        self.dead_workers = dead_workers if on_failure == "continue" else None
        self.dead: set[int] = set()  # workers this one knows to be dead
        self.job = JobView.of(process_group, model_device(model), timeout_s, self.name)
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
        self.stats.iteration += 1  # protocols that skip iterations overwrite this in _sync
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
        return self.stats.as_dict()

    def new_deaths(self) -> set[int]:
        """Deaths the launcher reported since the last call (continue mode; empty otherwise)."""
        if self.dead_workers is None:
            return set()
        new = set(self.dead_workers()) - self.dead
        self.dead |= new
        return new

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
