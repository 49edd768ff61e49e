"""The synchronous baseline: PyTorch's own DistributedDataParallel, unchanged.

The only additions are measurements: a DDP communication hook that wraps the
stock ``allreduce_hook`` (or, with ``compression``, torch's own
``bf16_compress_hook`` or ``powerSGD_hook``) to time how long the backward pass
waits for gradient all-reduces (reported as wait, not compute) and to count
(and, with an emulated ``link``, charge) the ring's bytes, and a one-element all-reduce in
``should_stop`` every ``STOP_CHECK_EVERY`` iterations so all workers leave the
loop at the same iteration (an unmatched collective would abort the job).
"""

from __future__ import annotations

import gc
import math
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from hetrain.comm.settings import CommSettings
from hetrain.compression.spec import CompressionSpec, matrix_of
from hetrain.errors import UsageError, WorkerError
from hetrain.protocols.allreduce_options import AllReduceOptions
from hetrain.protocols.options import options_or_settings
from hetrain.runtime.consensus import average_state
from hetrain.runtime.protocol import SyncProtocol, comm_from
from hetrain.runtime.public_signature import document_settings, keywords_given
from hetrain.transport.device_thread import wait_work
from hetrain.transport.job import DEFAULT_TIMEOUT_S
from hetrain.transport.link_spec import LinkSpec, ring_allreduce_bytes

# Workers agree on stopping every this many iterations (a stop may come up to this many
# iterations late); agreeing at every iteration doubled the collectives per step.
STOP_CHECK_EVERY = 4
POWERSGD_MIN_COMPRESSION_RATE = 2  # torch's default: a matrix is compressed when that halves it at least


class _HookTimer:
    """Per backward: time from the last bucket's launch to the last completion; the link's charge per bucket.

    On a GPU (``device`` CUDA) the stamps are CUDA events: NCCL's future runs its callbacks when the
    all-reduce is *enqueued*, on a stream that waits for it, so the host clock there would stamp the
    launch; an event recorded on that stream completes with the kernel. Read (each event waited for,
    not the device) when the step takes the iteration's wait."""

    def __init__(self, process_group, link, world_size: int, compression, device=None):
        self.process_group = process_group
        self.events = device is not None and device.type == "cuda"
        self._launch_event = None
        self._done_events: list = []
        self.link = link
        self.world_size = world_size
        self.compression = compression
        self.last_launch = 0.0
        self.last_done = 0.0
        self.total_wait_s = 0.0
        self.bytes_uncompressed = self.bytes_compressed = 0
        self.buckets = 0  # gradient buckets all-reduced so far (a step with none: the forward bypassed DDP)
        self.hook, self.hook_state = default_hooks.allreduce_hook, process_group
        if compression.kind == "bf16":
            self.hook = default_hooks.bf16_compress_hook
        elif compression.kind == "powersgd":  # from the first steps on (torch's default waits 1,000)
            self.hook = powerSGD_hook.powerSGD_hook
            self.hook_state = powerSGD_hook.PowerSGDState(process_group, matrix_approximation_rank=compression.rank,
                                                          start_powerSGD_iter=2,
                                                          min_compression_rate=POWERSGD_MIN_COMPRESSION_RATE)
        self.layouts: dict[int, list[tuple]] = {}  # PowerSGD: each bucket's gradient shapes as last compressed
        self.restored: dict[int, dict] = {}  # PowerSGD: a checkpoint's tensors by bucket, until put back
        self.restored_iter = 0  # PowerSGD: the iteration the checkpoint's state was at

    def bucket_bytes(self, bucket) -> int:
        """Bytes one member's share of the bucket's all-reduce(s) carries, as the hook compresses it."""
        if self.compression.kind == "bf16":
            return bucket.buffer().numel() * 2
        if self.compression.kind == "powersgd":
            total = 0
            for grad in bucket.gradients():
                matrix, rank = matrix_of(tuple(grad.shape)), self.compression.rank
                low = matrix is not None and (matrix[0] + matrix[1]) * min(rank, *matrix) * \
                    POWERSGD_MIN_COMPRESSION_RATE < grad.numel()
                total += 4 * ((matrix[0] + matrix[1]) * min(rank, *matrix) if low else grad.numel())
            return total
        return bucket.buffer().numel() * bucket.buffer().element_size()

    def collectives(self, bucket) -> int:
        """All-reduces the hook runs for the bucket: torch's PowerSGD hook runs one for the tensors it
        leaves uncompressed (if any), one for the Ps and one for the Qs; the others one."""
        if self.compression.kind != "powersgd":
            return 1
        rank = self.compression.rank
        shapes = [matrix_of(tuple(grad.shape)) for grad in bucket.gradients()]
        low = [m is not None and (m[0] + m[1]) * min(rank, *m) * POWERSGD_MIN_COMPRESSION_RATE < math.prod(m)
               for m in shapes]
        return (2 if any(low) else 0) + (0 if all(low) else 1)

    def powersgd_state(self, rank: int) -> tuple[dict, dict]:
        """PowerSGD's state for a checkpoint: what every replica holds alike (iteration, rank, warm-start P
        and Q, each bucket's layout) and worker ``rank``'s own error feedback. Without it a resumed run
        compressed from a cold start: two more uncompressed iterations, random Q, every worker's residual
        lost. A checkpoint's tensors not put back yet (a save soon after a resume) are saved as loaded."""
        hook = self.hook_state
        copy = lambda tensors: {index: t.detach().cpu().clone() for index, t in tensors.items()}  # noqa: E731
        shared = {"iter": hook.iter, "rank": hook.matrix_approximation_rank, "p": copy(hook.p_memory_dict),
                  "q": copy(hook.q_memory_dict),
                  "layouts": {index: list(map(list, layout)) for index, layout in self.layouts.items()}}
        own = {"rank": rank, "error": copy(hook.error_dict)}
        if self.restored:
            shared["iter"] = max(shared["iter"], self.restored_iter)
            for index, saved in self.restored.items():
                shared["layouts"][index] = list(map(list, saved["layout"]))
                for name, into in (("p", shared["p"]), ("q", shared["q"]), ("error", own["error"])):
                    if saved[name] is not None:
                        into[index] = saved[name]
        return shared, own

    def load_powersgd_state(self, shared: dict, own: dict, rank: int) -> None:
        """Restore :meth:`powersgd_state` (worker ``rank``'s). DDP rebuilds its buckets after a fresh
        wrapper's first iteration, so that one runs uncompressed (as torch's own first two do) and the saved
        tensors are put back at the first compressed call of each bucket whose gradients have the saved
        shapes (others start cold). A state of another PowerSGD rank starts cold, and so does another
        worker's error feedback (a Lightning or Accelerate checkpoint holds rank 0's only)."""
        if shared.get("rank") != self.hook_state.matrix_approximation_rank:
            return
        self.restored_iter = int(shared["iter"])
        self.hook_state.iter = max(0, min(self.restored_iter, self.hook_state.start_powerSGD_iter - 1))
        errors = own.get("error", {}) if own.get("rank") == rank else {}
        self.restored = {int(index): {"layout": [tuple(shape) for shape in layout], "p": shared["p"].get(index),
                                      "q": shared["q"].get(index), "error": errors.get(index)}
                         for index, layout in shared["layouts"].items()}

    def before_compressing(self, bucket) -> None:
        """Note the bucket's layout; put back its restored state if the layout is the saved one."""
        index, layout = bucket.index(), [tuple(g.shape) for g in bucket.gradients()]
        self.layouts[index] = layout
        saved = self.restored.pop(index, None)
        if saved is None or saved["layout"] != layout:
            return
        device, hook = bucket.buffer().device, self.hook_state
        for name, into in (("p", hook.p_memory_dict), ("q", hook.q_memory_dict), ("error", hook.error_dict)):
            if saved[name] is not None:
                into[index] = saved[name].to(device)

    def uncompressed_now(self) -> bool:
        """Whether the hook all-reduces this bucket uncompressed: torch's PowerSGD hook does for its first
        ``start_powerSGD_iter`` iterations (one plain all-reduce of the whole buffer)."""
        state = self.hook_state
        return self.compression.kind == "powersgd" and state.iter < state.start_powerSGD_iter

    def charge(self, bucket, plain: bool = False) -> None:
        whole = bucket.buffer().numel() * bucket.buffer().element_size()
        sent = ring_allreduce_bytes(self.world_size, whole if plain else self.bucket_bytes(bucket))
        self.bytes_compressed += int(sent)
        self.bytes_uncompressed += int(ring_allreduce_bytes(self.world_size, bucket.buffer().numel() * 4))
        # each collective pays its ring's latencies, one after another
        collectives = 1 if plain else self.collectives(bucket)
        self.link.collective(range(self.world_size), sent, sent, 2 * (self.world_size - 1) * collectives)

    def launched(self) -> None:
        """A bucket's all-reduce is being launched (the last launch counts)."""
        if self.events:
            self._launch_event = self._event()
        else:
            self.last_launch = time.perf_counter()

    def done(self) -> None:
        """A bucket's all-reduce completed (on a GPU: an event on the callback's stream, which waits for it)."""
        if self.events:
            self._done_events.append(self._event())
        else:
            self.last_done = max(self.last_done, time.perf_counter())

    @staticmethod
    def _event():
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def pending_wait(self) -> float:
        """This backward's wait so far, not yet taken (host clock; 0 on a GPU, whose stamps are events)."""
        return 0.0 if self.events else max(0.0, self.last_done - self.last_launch)

    def take_iteration_wait(self) -> float:
        if self.events:
            launch, done, self._launch_event, self._done_events = self._launch_event, self._done_events, None, []
            if launch is not None and done:
                launch.synchronize()
                for event in done:
                    event.synchronize()  # these events only, not the device
                self.last_done = max(launch.elapsed_time(event) for event in done) / 1000.0  # ms -> s
        wait = max(0.0, self.last_done - self.last_launch)
        self.total_wait_s += wait
        self.last_launch = self.last_done = 0.0
        return wait


def _timed_allreduce_hook(timer: _HookTimer, bucket):
    timer.buckets += 1
    timer.launched()
    plain = timer.uncompressed_now()  # read before the hook: it counts its iterations
    if timer.compression.kind == "powersgd" and not plain:
        timer.before_compressing(bucket)
    future = timer.hook(timer.hook_state, bucket)

    def record(fut):
        timer.charge(bucket, plain)  # held here for an emulated link: the backward pass waits for it
        timer.done()
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

    _steps_together = True

    name = "allreduce"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                 sync_every: int = CommSettings.sync_every, local_work: str = CommSettings.local_work,
                 outer_optimizer: str | torch.optim.Optimizer = CommSettings.outer_optimizer,
                 outer_lr: float | None = CommSettings.outer_lr, outer_momentum: float | None = CommSettings.outer_momentum,
                 compression: str | CompressionSpec = CommSettings.compression,
                 gossip_step: float | None = CommSettings.gossip_step, link_mbps: str | None = CommSettings.link_mbps,
                 link_latency_ms: str | None = CommSettings.link_latency_ms, link: LinkSpec | str | float | None = None,
                 options: AllReduceOptions | None = None, comm: CommSettings | None = None, process_group=None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, on_failure: str = "abort", dead_workers=None):
        settings = keywords_given(locals(), AllReduceOptions)
        comm = comm_from(comm, settings, "AllReduce")
        options = options_or_settings(AllReduceOptions, options, settings, "AllReduce")
        options.check_on_failure(on_failure)
        super().__init__(model, optimizer, options=options, comm=comm, process_group=process_group,
                         timeout_s=timeout_s)
        device_ids = [self.job.device.index] if self.job.device.type == "cuda" else None
        self.ddp = DistributedDataParallel(model, device_ids=device_ids, process_group=process_group)
        self._timer = _HookTimer(process_group, self.link, self.job.world_size, self.compression, self.job.device)
        self.ddp.register_comm_hook(self._timer, _timed_allreduce_hook)
        self._flag = torch.zeros(2, device=self.job.device)  # [stop wish, checkpoint wish], MAX over workers
        self._checkpoint_wish = False
        self._checkpoint_agreed = False
        self._buckets_seen = 0
        self.restart_clock()

    @property
    def module(self):
        return self.ddp if self.ddp is not None else self.model

    def metrics(self) -> dict:
        self.stats.extra.update(uncompressed_bytes=self._timer.bytes_uncompressed,
                                compressed_bytes=self._timer.bytes_compressed)
        return super().metrics()

    def _sync(self) -> None:
        if self.ddp is not None and self._timer.buckets == self._buckets_seen:
            raise UsageError(f"worker {self.job.rank}: an optimizer step whose gradients no worker averaged: DDP "
                             "all-reduces a forward pass through its wrapper only; run the model as sync.module(x), "
                             "not model(x)")
        self._buckets_seen = self._timer.buckets
        # DDP already averaged the gradients inside backward(); move that wait from compute to wait.
        wait = self._timer.take_iteration_wait()
        self.stats.compute_s -= wait
        self.stats.wait_s += wait

    def _backward_wait_s(self) -> float:
        """The all-reduce's wait inside this iteration's backward (not compute: the emulated sleep leaves it out)."""
        return self._timer.pending_wait()

    def should_stop(self, local_done: bool) -> bool:
        if self.stats.iterations % STOP_CHECK_EVERY:
            return False  # every worker skips the vote at the same iterations
        began = time.perf_counter()
        self._flag[0] = 1.0 if local_done else 0.0
        self._flag[1] = 1.0 if self._checkpoint_wish else 0.0
        try:
            wait_work(dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self.job.group, async_op=True),
                      self.job.timeout, self.job.nccl, "the stop vote")
        except Exception as exc:
            raise WorkerError(f"worker {self.job.rank} waited for the others' vote on stopping at iteration "
                              f"{self.stats.iterations}: {str(exc).splitlines()[0][:160]}") from None
        self._pay_vote(self._flag.numel() * self._flag.element_size())
        spent = time.perf_counter() - began
        self.stats.wait_s += spent
        self.stats.compute_s -= spent  # the gap between steps counts as compute
        self._checkpoint_agreed = bool(self._flag[1].item() > 0)
        return bool(self._flag[0].item() > 0)

    def _checkpoint_due(self, wish: bool) -> bool:
        """Checkpoints happen at a stop vote where some worker wished one: the same iteration everywhere."""
        self._checkpoint_wish = self._checkpoint_wish or wish
        agreed, self._checkpoint_agreed = self._checkpoint_agreed, False
        if agreed:
            self._checkpoint_wish = False
        return agreed

    def _extra_state(self) -> dict:
        if self.compression.kind != "powersgd":
            return {}
        shared, own = self._timer.powersgd_state(self.job.rank)
        return {"powersgd": shared, "own": {"powersgd": own}}  # "own": kept when the replicas load rank 0's state

    def _load_extra_state(self, state: dict) -> None:
        if self.compression.kind == "powersgd" and "powersgd" in state:
            self._timer.load_powersgd_state(state["powersgd"], state.get("own", {}).get("powersgd", {}), self.job.rank)

    def _finish(self) -> None:
        self.stats.extra["consensus_distance"] = average_state(self.state, self.job)

    def _release(self) -> None:
        # Release DDP's reducer while the process group still exists: with a plain DDP script,
        # deleting the module before destroy_process_group avoided PyTorch 2.13's abort at exit
        # (docs/decisions/local-job-processes.md). References the user still holds can keep it alive regardless.
        self.ddp = None
        gc.collect()  # DDP sits in reference cycles


document_settings(AllReduce, AllReduceOptions)
