"""The synchronous baseline: PyTorch's own DistributedDataParallel, unchanged.

The only additions are measurements: a DDP communication hook that wraps the
stock ``allreduce_hook`` to time how long the backward pass waits for gradient
all-reduces (reported as wait, not compute), and a one-element all-reduce in
``should_stop`` every ``STOP_CHECK_EVERY`` iterations so all workers leave the
loop at the same iteration (an unmatched collective would abort the job).
"""

from __future__ import annotations

import gc
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from hetrain.errors import WorkerError
from hetrain.protocols.allreduce_options import AllReduceOptions
from hetrain.protocols.options import options_or_settings
from hetrain.runtime.consensus import average_state
from hetrain.runtime.job import DEFAULT_TIMEOUT_S
from hetrain.runtime.protocol import SyncProtocol

# Workers agree on stopping every this many iterations (a stop may come up to this many
# iterations late); agreeing at every iteration doubled the collectives per step.
STOP_CHECK_EVERY = 4


class _HookTimer:
    """Per backward: time from the last bucket's launch to the last completion."""

    def __init__(self, process_group=None):
        self.process_group = process_group
        self.last_launch = 0.0
        self.last_done = 0.0
        self.total_wait_s = 0.0

    def take_iteration_wait(self) -> float:
        wait = max(0.0, self.last_done - self.last_launch)
        self.total_wait_s += wait
        self.last_launch = self.last_done = 0.0
        return wait


def _timed_allreduce_hook(timer: _HookTimer, bucket):
    timer.last_launch = time.perf_counter()
    future = default_hooks.allreduce_hook(timer.process_group, bucket)

    def record(fut):
        timer.last_done = max(timer.last_done, time.perf_counter())
        return fut.value()[0] if isinstance(fut.value(), list) else fut.value()

    return future.then(record)


class AllReduce(SyncProtocol):
    """All-Reduce data parallelism through ``torch.nn.parallel.DistributedDataParallel``, unchanged.

    DDP needs its wrapper for the forward pass: use ``sync.module(x)``. Its
    workers must run the same number of iterations; loops that stop on a time
    budget ask ``sync.should_stop(local_done)``, which agrees across workers.

    Example::

        with hetrain.AllReduce(model, optimizer) as sync:
            while not sync.should_stop(local_done=time.time() > deadline):
                optimizer.zero_grad(); loss_fn(sync.module(x), y).backward(); optimizer.step()
    """

    name = "allreduce"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                 options: AllReduceOptions | None = None, process_group=None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 on_failure: str = "abort", dead_workers=None):
        self.options = options_or_settings(AllReduceOptions, options, {}, "AllReduce")
        self.options.check_on_failure(on_failure)
        super().__init__(model, optimizer, process_group=process_group, timeout_s=timeout_s)
        device_ids = [self.job.device.index] if self.job.device.type == "cuda" else None
        self.ddp = DistributedDataParallel(model, device_ids=device_ids, process_group=process_group)
        self._timer = _HookTimer(process_group)
        self.ddp.register_comm_hook(self._timer, _timed_allreduce_hook)
        self._flag = torch.zeros(2, device=self.job.device)  # [stop wish, checkpoint wish], MAX over workers
        self._checkpoint_wish = False
        self._checkpoint_agreed = False
        self.restart_clock()

    @property
    def module(self):
        return self.ddp if self.ddp is not None else self.model

    def _sync(self) -> None:
        # DDP already averaged the gradients inside backward(); move that wait from compute to wait.
        wait = self._timer.take_iteration_wait()
        self.stats.compute_s -= wait
        self.stats.wait_s += wait

    def should_stop(self, local_done: bool) -> bool:
        if self.stats.iterations % STOP_CHECK_EVERY:
            return False  # every worker skips the vote at the same iterations
        began = time.perf_counter()
        self._flag[0] = 1.0 if local_done else 0.0
        self._flag[1] = 1.0 if self._checkpoint_wish else 0.0
        try:
            dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self.job.group,
                            async_op=True).wait(timeout=self.job.timeout)
        except Exception as exc:
            raise WorkerError(f"worker {self.job.rank} waited for the others' vote on stopping at iteration "
                              f"{self.stats.iterations}: {str(exc).splitlines()[0][:160]}") from None
        spent = time.perf_counter() - began
        self.stats.wait_s += spent
        self.stats.compute_s -= spent  # the gap between steps counts as compute
        self._checkpoint_agreed = bool(self._flag[1].item() > 0)
        return bool(self._flag[0].item() > 0)

    def checkpoint_due(self, wish: bool) -> bool:
        """Checkpoints happen at a stop vote where some worker wished one: the same iteration everywhere."""
        self._checkpoint_wish = self._checkpoint_wish or wish
        agreed, self._checkpoint_agreed = self._checkpoint_agreed, False
        if agreed:
            self._checkpoint_wish = False
        return agreed

    def _finish(self) -> None:
        self.stats.extra["consensus_distance"] = average_state(self.state, self.job)

    def _release(self) -> None:
        # Release DDP's reducer while the process group still exists: with a plain DDP script,
        # deleting the module before destroy_process_group avoided PyTorch 2.13's abort at exit
        # (docs/decisions.md). References the user still holds can keep it alive regardless.
        self.ddp = None
        gc.collect()  # DDP sits in reference cycles
