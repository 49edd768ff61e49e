"""hetrain's protocols around an Accelerate training loop, in the shape of Accelerate's ``LocalSGD``.

    import hetrain.integrations.accelerate as hetrain_accelerate   # before Accelerator(): see below
    accelerator = Accelerator(cpu=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    with hetrain_accelerate.HetrainSync(accelerator, model, optimizer, protocol="prague") as sync:
        for x, y in loader:
            optimizer.zero_grad(); accelerator.backward(loss_fn(model(x), y)); optimizer.step()
    # leaving the block drained the protocol: every process holds the consensus model

Launch it as any multi-process Accelerate script: ``accelerate launch --multi_gpu --num_processes 4
train.py`` (on CPUs too, with ``Accelerator(cpu=True)``: see examples/accelerate_prague.py) or torchrun.
Inside the block the model Accelerate wrapped in DistributedDataParallel runs as
``no_sync()`` does (no gradient all-reduce) and without DDP's buffer broadcast, and the
protocol, built around ``accelerator.unwrap_model(model)`` and the optimizer Accelerate
wraps, synchronizes after each real optimizer step (steps Accelerate skips while
accumulating gradients do not count). Accelerate's data loaders broadcast rank 0's random
state at the start of every epoch (a collective: the fast processes would wait there for the
slow one, and one waiting there while its group waits for it in the protocol deadlocks):
inside the block they are synchronized once, on entry, and then each process's generators
go on alike (every epoch draws one permutation on every process). ``protocol="allreduce"`` leaves Accelerate's own
DDP in charge (it is All-Reduce). ``enabled=False`` makes the block a no-op, as with
``LocalSGD``. Keywords are the protocol's settings (as for ``hetrain.Hop`` etc.).

Batches by speed: a prepared loader gives every process the same number of batches, so each
epoch lasts as long as the slowest process needs for its share. ``sync.shared_loader(loader)``,
given the plain (unprepared) ``DataLoader``, shares each epoch out by speed instead (as
``HetrainStrategy`` does for Lightning: hetrain.integrations.shared_batches): a process three
times faster takes three times the batches, an epoch is still one pass over the data, and the
batches arrive on ``accelerator.device``. Each ``for`` over it is one epoch. Every process must
call it, in the same order; with ``allreduce`` (lockstep) or when disabled it returns
``accelerator.prepare_data_loader(loader)``, so the same loop runs either way.

Importing this module does what ``hetrain.init()`` does before the process group exists
(prefer lazy gloo connections, import ``torch._dynamo``: see hetrain.transport.job.init), so
import it before creating the ``Accelerator``. ``on_failure`` other than ``"abort"`` is
refused: Accelerate's launchers (torchrun, mpirun) stop every process when one dies.
"""

from __future__ import annotations

from itertools import count
from typing import Any

from hetrain.extras import require

require("accelerate", "accelerate", "HetrainSync")

import torch  # noqa: E402
import torch._dynamo  # noqa: E402, F401 (before the process group: see hetrain.transport.job.init)
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.data import DataLoader, RandomSampler  # noqa: E402

from hetrain.errors import UsageError  # noqa: E402
from hetrain.integrations.job_progress import follow_job  # noqa: E402
from hetrain.integrations.shared_batches import SharedBatches, with_batch_sampler  # noqa: E402
from hetrain.registry import get_spec  # noqa: E402
from hetrain.runtime.protocol import SyncProtocol  # noqa: E402
from hetrain.transport.job import DEFAULT_TIMEOUT_S, job_store, prefer_lazy_connections  # noqa: E402

__all__ = ["HetrainSync"]

PASS_THROUGH = "allreduce"  # Accelerate's own DistributedDataParallel already is this protocol

UNSUPPORTED = ("FSDP", "DEEPSPEED", "MEGATRON_LM")  # sharded models: no whole replica per process to average
_shared_loaders = count()  # every process creates its shared loaders in the same order: same store prefixes

if not torch.distributed.is_initialized():
    prefer_lazy_connections()


class HetrainSync:
    """Synchronize an Accelerate loop with one of hetrain's protocols (see the module docstring)."""

    def __init__(self, accelerator, model: torch.nn.Module, optimizer, protocol: str = "hop", *,
                 enabled: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S, on_failure: str = "abort",
                 seed: int = 0, **options: Any):
        self.spec = get_spec(protocol)
        if on_failure != "abort":
            raise UsageError(f"HetrainSync: on_failure={on_failure!r} cannot work under Accelerate's launchers "
                             "(torchrun, mpirun): they stop every process when one dies")
        self.accelerator = accelerator
        self.model = model
        self.optimizer = optimizer
        self.protocol = protocol
        self.enabled = enabled and protocol != PASS_THROUGH and accelerator.num_processes > 1
        self.timeout_s = timeout_s
        self.on_failure = on_failure
        self.seed = seed
        self.options = options
        self.sync: SyncProtocol | None = None
        self._ddp_settings: tuple | None = None
        self._shared: list[SharedLoader] = []  # the shared loaders, in the order they were made
        self._undo_local = None  # puts the accelerator's collectives back (see local_collectives)
        self._followed: list = []  # prepared schedulers following the job's progress while the block runs
        self._pending: dict | None = None  # a state loaded before the block built its protocol
        self._loaders: list[tuple] = []  # (prepared data loader, its rng_types) while the block runs

    def __enter__(self) -> HetrainSync:
        if not self.enabled:
            return self
        kind = getattr(self.accelerator.distributed_type, "name", str(self.accelerator.distributed_type))
        if kind in UNSUPPORTED or hasattr(self.model, "_orig_mod"):
            what = "a torch.compile'd model (--dynamo_backend)" if kind not in UNSUPPORTED else kind
            raise UsageError(f"HetrainSync averages whole replicas of a DDP (or plain) model; {what} is not "
                             "supported: launch without it (e.g. --dynamo_backend no), or use "
                             "protocol='allreduce' (Accelerate's own)")
        try:
            self._start()
        except BaseException:
            self._restore()  # nothing half-switched: DDP syncs again, the loaders broadcast their RNG again
            raise
        return self

    def _start(self) -> None:
        if isinstance(self.model, DistributedDataParallel):
            ddp = self.model
            self._ddp_settings = (ddp.require_backward_grad_sync, ddp.broadcast_buffers)
            ddp.require_backward_grad_sync = False  # what ddp.no_sync() does, for the whole block
            ddp.broadcast_buffers = False  # each rank keeps its own BatchNorm statistics; the protocol averages them
        self._sync_loaders_once()
        self._undo_local = local_collectives(self.accelerator)
        self._follow_schedulers()
        runtime: dict[str, Any] = {"seed": self.seed} if self.spec.seeded else {}
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)  # AcceleratedOptimizer wraps it
        self.sync = self.spec.runtime_class()(self.accelerator.unwrap_model(self.model), optimizer,
                                              timeout_s=self.timeout_s, on_failure=self.on_failure,
                                              **runtime, **self.options)
        if self._pending is not None and self._pending.get("protocol") is not None:
            self.sync.load_state_dict(self._pending["protocol"])  # counters, Hop's iteration, outer anchor, momentum
            self._pending = {**self._pending, "protocol": None}

    def _follow_schedulers(self) -> None:
        """Schedulers prepared by Accelerate follow the shared epochs' progress over all processes (see
        hetrain.integrations.job_progress): Accelerate's convention already sizes them by the whole epoch
        (a prepared scheduler steps once per process for each optimizer step), so every process's schedule
        ends with the training however the batches were shared."""
        from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

        if not hasattr(self.accelerator, "_schedulers"):
            import accelerate

            raise UsageError(f"HetrainSync relies on Accelerator._schedulers (the prepared schedulers), which "
                             f"Accelerate {accelerate.__version__} does not have; use an Accelerate within "
                             "hetrain's supported range (pyproject.toml: accelerate>=0.30.1,<1.17)")
        for prepared in self.accelerator._schedulers:
            inner = getattr(prepared, "scheduler", prepared)
            if isinstance(inner, LRScheduler) and not isinstance(inner, ReduceLROnPlateau):
                follow_job(inner, self._job_steps)
                self._followed.append(inner)

    def _job_steps(self) -> int | None:
        """Optimizer steps of the whole job so far, counted in batches claimed over all processes (None
        before a shared loader exists: a prepared loader's static shards step schedulers as Accelerate does)."""
        if not self._shared:
            return None
        return self._shared[0].sampler.position // max(1, self.accelerator.gradient_accumulation_steps)

    # -- checkpoints: accelerator.register_for_checkpointing(sync) -------------------------------
    def state_dict(self) -> dict:
        """The protocol's state and the shared loaders' epochs, for ``accelerator.register_for_checkpointing``
        (``save_state`` is a barrier: call it after the block, or where every process reaches it together)."""
        if self.sync is None and self._pending is not None:
            return dict(self._pending)  # loaded, not used yet: saved as it came
        return {"protocol_name": self.protocol, "protocol": None if self.sync is None else self.sync.state_dict(),
                "shared_loader_epochs": [loader.epoch for loader in self._shared]}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` saved; before the block, the protocol's part waits until the block
        builds the protocol (``accelerator.load_state`` usually runs before training starts)."""
        if state.get("protocol_name") not in (None, self.protocol):
            raise UsageError(f"HetrainSync: the checkpoint holds the {state['protocol_name']!r} protocol's state and "
                             f"this block runs {self.protocol!r}; resume with the same protocol")
        for loader, epoch in zip(self._shared, state.get("shared_loader_epochs", [])):
            loader.epoch = epoch
        if self.sync is not None and state.get("protocol") is not None:
            self.sync.load_state_dict(state["protocol"])
            state = {**state, "protocol": None}
        self._pending = state

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if exc_type is None:
                for scheduler in self._followed:
                    scheduler.step()  # to where the whole job got: the end of the schedule after the last epoch
            if self.sync is not None:
                self.sync.__exit__(exc_type, exc, tb)  # finish (consensus), or only release after an error
        finally:
            self._restore()
        return False

    def _restore(self) -> None:
        """Accelerate's DDP, loaders, collectives and schedulers as they were before the block."""
        undo, self._undo_local = self._undo_local, None
        if undo is not None:
            undo()
        for scheduler in self._followed:
            follow_job(scheduler, lambda: None)  # stepped as usual again
        self._followed = []
        if self._ddp_settings is not None:
            self.model.require_backward_grad_sync, self.model.broadcast_buffers = self._ddp_settings
            self._ddp_settings = None
        for loader, rng_types in self._loaders:
            loader.rng_types = rng_types
        self._loaders = []

    def _sync_loaders_once(self) -> None:
        """Synchronize the prepared loaders' random state now, not at every epoch (see the module docstring)."""
        from accelerate.utils import synchronize_rng_states

        if not hasattr(self.accelerator, "_dataloaders"):  # no public accessor (Accelerate 1.16): never guess
            import accelerate

            raise UsageError(f"HetrainSync relies on Accelerator._dataloaders (the prepared loaders), which "
                             f"Accelerate {accelerate.__version__} does not have; use an Accelerate within "
                             "hetrain's supported range (pyproject.toml: accelerate>=0.30.1,<1.17)")
        refuse_dispatchers(self.accelerator._dataloaders)
        for loader in self.accelerator._dataloaders:
            rng_types = getattr(loader, "rng_types", None)
            if rng_types:
                synchronize_rng_states(rng_types, getattr(loader, "synchronized_generator", None))
                self._loaders.append((loader, rng_types))
                loader.rng_types = None

    def shared_loader(self, dataloader: DataLoader):
        """``dataloader``'s epochs shared out among the processes by speed (see the module docstring)."""
        if not isinstance(dataloader, DataLoader) or dataloader.batch_size is None:
            raise UsageError("HetrainSync.shared_loader takes the plain torch DataLoader (before "
                             "accelerator.prepare), built with batch_size=")
        if not self.enabled:
            return self.accelerator.prepare_data_loader(dataloader)
        store = job_store()
        if store is None:
            raise UsageError("HetrainSync.shared_loader needs the job's c10d store (torch.distributed's "
                             "default group): launch with accelerate launch or torchrun")
        sampler = SharedBatches(len(dataloader.dataset), dataloader.batch_size,
                                torch.distributed.PrefixStore(f"accelerate/batches/{next(_shared_loaders)}/", store),
                                shuffle=isinstance(dataloader.sampler, RandomSampler), seed=self.seed,
                                drop_last=dataloader.drop_last)
        loader = SharedLoader(with_batch_sampler(dataloader, sampler), sampler, self.accelerator.device)
        epochs = (self._pending or {}).get("shared_loader_epochs", [])
        if len(epochs) > len(self._shared):
            loader.epoch = epochs[len(self._shared)]  # a resumed run: this loader goes on from its saved epoch
        self._shared.append(loader)
        return loader

    def metrics(self) -> dict:
        """The protocol's metrics for this process (empty when disabled or passed through)."""
        return self.sync.metrics() if self.sync is not None else {}


LOCAL = ("wait_for_everyone", "gather", "gather_for_metrics", "reduce", "pad_across_processes")


def local_collectives(accelerator):
    """Inside the block the processes run apart, so the accelerator's collectives are made local (as
    HetrainStrategy does for Lightning's): ``wait_for_everyone`` returns at once, ``gather``,
    ``gather_for_metrics``, ``reduce`` and ``pad_across_processes`` return this process's own data
    (a metric is then this process's). As collectives, a fast process would wait in each for the
    slowest, and one waiting there while its Prague group waits for it would deadlock until the
    timeout. ``save_state`` works on (its barriers are ``wait_for_everyone``): process 0 writes its
    model as it is. Returns the function that puts them back."""
    saved = {name: accelerator.__dict__.get(name) for name in LOCAL}
    accelerator.wait_for_everyone = lambda: None
    accelerator.gather = lambda tensor: tensor
    accelerator.gather_for_metrics = lambda input_data, use_gather_object=False: input_data
    accelerator.reduce = lambda tensor, reduction="sum", scale=1.0: tensor * scale if scale != 1.0 else tensor
    accelerator.pad_across_processes = lambda tensor, dim=0, pad_index=0, pad_first=False: tensor

    def undo() -> None:
        for name, value in saved.items():
            if value is None:
                accelerator.__dict__.pop(name, None)
            else:
                accelerator.__dict__[name] = value

    return undo


def refuse_dispatchers(loaders) -> None:
    """A loader that dispatches batches from process 0 (``DataLoaderDispatcher``: Accelerate's default for
    iterable datasets, or ``dispatch_batches=True``) broadcasts every batch: refused in one line."""
    from accelerate.data_loader import DataLoaderDispatcher

    for loader in loaders:
        if isinstance(loader, DataLoaderDispatcher):
            raise UsageError("HetrainSync: a prepared loader dispatches batches from process 0 (Accelerate's "
                             "DataLoaderDispatcher: a broadcast per batch, which processes running apart would "
                             "wait in); use sync.shared_loader(loader) with the plain DataLoader, or "
                             "Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=False))")


class SharedLoader:
    """Batches shared out by speed, on the accelerator's device; each iteration over it is the next epoch.
    ``taken``: the batches this process took in its current or last epoch."""

    def __init__(self, loader: DataLoader, sampler: SharedBatches, device):
        self.loader = loader
        self.sampler = sampler
        self.device = device
        self.epoch = 0

    @property
    def taken(self) -> int:
        return self.sampler.taken

    def __len__(self) -> int:
        """The epoch's batches over all processes: an upper bound on what this one takes (a plain loader's
        ``len`` is one process's share; here the share follows each process's speed, and :attr:`taken` says
        what it was). Loops and schedulers sized by ``len(loader)`` run, and never past the epoch."""
        return self.sampler.num_batches

    def __iter__(self):
        from accelerate.utils import send_to_device

        self.sampler.set_epoch(self.epoch)
        self.epoch += 1
        for batch in self.loader:
            yield send_to_device(batch, self.device)
