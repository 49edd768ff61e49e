"""hetrain's protocols as a Lightning strategy.

    trainer = Trainer(strategy=HetrainStrategy("hop", topology="ring"), accelerator="cpu", devices=4)
    trainer.fit(module, datamodule)        # every rank ends fit() with the consensus model

Built like Lightning's ``DDPStrategy`` (same launcher, cluster environments,
process group: run the script with ``python`` and Lightning starts the other
ranks, or run it under ``torchrun``), but instead of wrapping the module in
DistributedDataParallel it builds the hetrain protocol around the
LightningModule and its optimizer, so the protocol synchronizes from the
optimizer's step (all six protocols; ``"allreduce"`` is DDP through hetrain).
Buffers (BatchNorm statistics) are averaged with the parameters. The protocol
finishes when training ends (``on_train_end``): every rank then holds the
consensus model, before ``fit()`` returns.

Decoupled ranks (every protocol but All-Reduce, whose workers step together):

* the training data are shared out by speed (:class:`SharedBatches`): a fast
  rank takes more batches, and an epoch is still one pass over the data;
* while the protocol runs, Lightning's collectives are local: ``barrier`` does
  nothing, ``broadcast`` returns this rank's object, ``reduce`` this rank's value
  (``self.log(..., sync_dist=True)`` logs this rank's value), and the per-batch
  SIGTERM broadcast is checked locally. Otherwise every rank would wait for the
  slowest at each of them (every batch, for the SIGTERM check), and a rank
  waiting in one while its neighbour waits for its model would deadlock.
  Validation runs on each rank's own model over its shard; checkpoints are rank
  0's model as it is at that moment (save after ``fit()`` for the consensus).
  Still collectives (fast ranks wait in them): ``all_gather`` and torchmetrics
  ``Metric`` objects passed to ``self.log`` (they synchronize by themselves).

``dynamic_batches=False`` keeps Lightning's static shards (every rank the same
batches). Other keywords are the protocol's settings (as for ``hetrain.Hop``
etc.), ``on_failure`` and ``timeout_s`` included.
"""

from __future__ import annotations

import math
import os
from datetime import timedelta
from itertools import count
from typing import Any

from hetrain.extras import require

require("lightning", "lightning", "HetrainStrategy")

import lightning  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy  # noqa: E402

try:  # private names this strategy relies on: one line naming the version if they moved, never a fallback
    from lightning.pytorch.overrides.distributed import _sync_module_states
    from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher
except ImportError as _missing:  # pragma: no cover - only on a Lightning outside the supported range
    raise ImportError(f"HetrainStrategy relies on private parts of Lightning ({_missing}), which Lightning "
                      f"{lightning.__version__} does not have; use a Lightning within hetrain's supported range "
                      "(pyproject.toml: lightning>=2.2.5,<2.7)") from None
from lightning.pytorch.trainer.states import TrainerFn  # noqa: E402
from lightning.pytorch.utilities.exceptions import SIGTERMException  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset  # noqa: E402

from hetrain.errors import UsageError  # noqa: E402
from hetrain.integrations.job_progress import follow_job, followed  # noqa: E402
from hetrain.integrations.liveness import StoreLiveness  # noqa: E402
from hetrain.integrations.shared_batches import LastBatchKnown, SharedBatches, with_batch_sampler  # noqa: E402
from hetrain.registry import get_spec  # noqa: E402
from hetrain.runtime.protocol import SyncProtocol  # noqa: E402
from hetrain.transport.job import DEFAULT_TIMEOUT_S, job_store, prefer_lazy_connections  # noqa: E402

__all__ = ["HetrainStrategy"]

SIGTERM_BROADCAST_SINCE = "2.5.2"  # the first Lightning whose epoch loop broadcasts rank 0's SIGTERM per batch
_samplers = count()  # every rank makes its samplers and liveness watchers in the same order: same prefixes
_fits = count()


def lockstep(protocol_class: type) -> bool:
    """Whether the protocol's workers must take the same steps (All-Reduce's; not read off which methods a
    class overrides: Prague overrides ``_checkpoint_due`` for its static schedule and is decoupled)."""
    return protocol_class._steps_together


class HetrainStrategy(DDPStrategy):
    """A Lightning strategy that trains with one of hetrain's protocols (see the module docstring)."""

    strategy_name = "hetrain"

    def __init__(self, protocol: str = "hop", *, timeout_s: float = DEFAULT_TIMEOUT_S, on_failure: str = "abort",
                 dynamic_batches: bool | None = None, seed: int = 0, accelerator=None, parallel_devices=None,
                 cluster_environment=None, checkpoint_io=None, precision_plugin=None,
                 process_group_backend: str | None = None, **options: Any):
        self.spec = get_spec(protocol)  # an unknown name fails here, naming the choices
        if on_failure == "respawn":
            raise UsageError("HetrainStrategy: on_failure='respawn' needs hetrain's launcher to start a "
                             "replacement; use 'continue' (the survivors finish) or 'abort'")
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=cluster_environment, checkpoint_io=checkpoint_io,
                         precision_plugin=precision_plugin, process_group_backend=process_group_backend,
                         timeout=timedelta(seconds=timeout_s))
        self.protocol = protocol
        self.options = options
        self.timeout_s = timeout_s
        self.on_failure = on_failure
        self.seed = seed
        self.lockstep = lockstep(self.spec.runtime_class())
        self.dynamic_batches = (not self.lockstep) if dynamic_batches is None else dynamic_batches
        if self.dynamic_batches and self.lockstep:
            raise ValueError(f"{protocol}'s workers step together: dynamic_batches would leave one waiting")
        self.sync: SyncProtocol | None = None
        self.liveness: StoreLiveness | None = None
        self.samplers: list[SharedBatches] = []
        self.loaders: list[LastBatchKnown] = []
        self._finished = False
        self._resumed: dict | None = None  # the protocol's state from a checkpoint, loaded once it is built

    # -- processes and the process group -------------------------------------------------------
    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if self.on_failure != "abort" and isinstance(self._launcher, _SubprocessScriptLauncher):
            self._launcher = _TolerantLauncher(self.cluster_environment, self.num_processes, self.num_nodes)

    def setup_distributed(self) -> None:
        """As DDP does, after what ``hetrain.init()`` does first (lazy gloo connections, dynamo imported
        before the group exists: see hetrain.transport.job.init)."""
        prefer_lazy_connections()
        import torch._dynamo  # noqa: F401

        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and not torch.distributed.is_initialized():
            from hetrain.transport.job import init

            self.set_world_ranks()
            self._process_group_backend = self._get_process_group_backend()
            init(backend=self._process_group_backend, timeout_s=self.timeout_s)  # torchrun: one store per attempt
        else:
            super().setup_distributed()

    def _get_process_group_backend(self) -> str:
        return self._process_group_backend or "gloo"  # hetrain's channels need gloo; GPU tensors go via the host

    # -- the model -----------------------------------------------------------------------------
    def configure_ddp(self) -> None:
        """No DDP wrapper: the protocol is built once the optimizer exists (``setup``)."""

    def setup(self, trainer) -> None:
        super().setup(trainer)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        if len(self.optimizers) != 1:
            raise ValueError(f"HetrainStrategy synchronizes one optimizer's steps; got {len(self.optimizers)}")
        # DDP's wrapper would broadcast rank 0's weights; without it an unseeded module starts apart
        _sync_module_states(self.lightning_module)
        runtime: dict[str, Any] = {}
        if self.on_failure != "abort":
            store = job_store()
            store = torch.distributed.PrefixStore(f"lightning/liveness/{next(_fits)}/", store) if store else None
            self.liveness = StoreLiveness.start(store, self.global_rank, self.world_size, self.timeout_s)
            runtime.update(on_failure=self.on_failure, dead_workers=self.liveness)
        if self.spec.seeded:
            runtime["seed"] = self.seed
        self.sync = self.spec.runtime_class()(self.lightning_module, self.optimizers[0], timeout_s=self.timeout_s,
                                              **runtime, **self.options)
        self._finished = False
        if self.liveness is not None:  # e.g. Prague's Group Generator, on rank 0, stops grouping the dead
            self.liveness.notify(self.sync._worker_left)  # deaths seen while the protocol was built too
        if self.sync.module is not self.lightning_module:
            self.model = self.sync.module  # All-Reduce: its DistributedDataParallel wrapper
        if self._resumed is not None:
            self.sync.load_state_dict(self._resumed)  # the counters, Hop's iteration, the outer anchor and momentum
            self._resumed = None
        if self.decoupled:
            _check_sigterm_locally(trainer)
            if self.dynamic_batches:
                _schedules_follow_the_job(self, trainer)
                _validate_by_the_jobs_progress(self, trainer)

    # -- checkpoints: the protocol's state beside the model's ------------------------------------
    def save_checkpoint(self, checkpoint: dict, filepath, storage_options=None) -> None:
        """As Lightning's, with the protocol's state under ``"hetrain"`` (rank 0's, as the model is)."""
        if self.sync is not None:
            checkpoint = {**checkpoint, "hetrain": self.sync.state_dict()}
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    def load_checkpoint(self, checkpoint_path, *args, **kwargs) -> dict:
        """As Lightning's; a checkpoint written by this strategy brings the protocol's state back at ``setup``, or at
        once when loaded during a fit (a rewound epoch of the shared loader is a full pass again:
        :mod:`hetrain.integrations.shared_batches`)."""
        checkpoint = super().load_checkpoint(checkpoint_path, *args, **kwargs)
        state = checkpoint.get("hetrain")
        if state is not None:
            if state.get("protocol") != self.spec.name:
                raise UsageError(f"HetrainStrategy: {checkpoint_path} was written by the {state.get('protocol')!r} "
                                 f"protocol and this run uses {self.spec.name!r}; resume with the same protocol")
            if self.sync is not None:  # loaded mid-fit: the running protocol takes it now, not never
                self.sync.load_state_dict(state)
            else:
                self._resumed = state  # taken at setup, once the protocol is built
        return checkpoint

    # -- the steps Lightning counts --------------------------------------------------------------
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """``max_steps`` counts the steps the protocol counts: Hop's iterations advance for every rank when
        a slow one skips, so every rank stops at the same iteration instead of the slow one training on."""
        super().on_train_batch_start(batch, batch_idx)
        if self.liveness is not None:
            self.liveness.dead_workers()  # a rank the others declared dead (a stall) leaves here, in one line
        trainer = self.lightning_module.trainer
        if self.loaders and self.loaders[-1].last and trainer.train_dataloader is self.loaders[-1] \
                and not _fetches_itself(self.lightning_module):
            # Lightning's fetcher flags the last batch by count (the loader's length: the epoch over all ranks),
            # which a rank's share never reaches; the loader knows (it drew one batch ahead). Flagged here, before
            # the batch trains, as Lightning flags it: the accumulation window closes with an optimizer step, and
            # the epoch ends with this batch (validation, epoch-interval schedulers) rather than by StopIteration.
            trainer.fit_loop.epoch_loop.batch_progress.is_last_batch = True
        if self.sync is not None and self.decoupled and trainer.max_steps > 0 \
                and self.sync.stats.iteration >= trainer.max_steps:
            trainer.should_stop = True

    @property
    def decoupled(self) -> bool:
        """Whether Lightning's collectives are local now: a decoupled protocol runs, or it ran and a rank
        died (``on_failure="continue"``: a collective over the world would wait for the dead)."""
        if self.sync is None or self.lockstep:
            return False
        return not self._finished or bool(self.sync.dead or (self.liveness and self.liveness.dead_workers()))

    def process_dataloader(self, dataloader: object) -> object:
        """The training loader of a fit, shared out by speed (decided from the settings, not from the
        protocol, which does not exist yet if ``configure_optimizers`` asked for
        ``trainer.estimated_stepping_batches``: Lightning then loads the data first)."""
        trainer = self.lightning_module.trainer
        if not (self.dynamic_batches and trainer.state.fn == TrainerFn.FITTING and trainer.training
                and _training_loader(dataloader)):
            return dataloader
        sampler = SharedBatches(len(dataloader.dataset), dataloader.batch_size,
                                torch.distributed.PrefixStore(f"lightning/batches/{next(_samplers)}/", job_store()),
                                seed=self.seed, drop_last=dataloader.drop_last)
        limit = trainer.limit_train_batches
        if isinstance(limit, float) and limit < 1.0:  # a share of the epoch over all ranks (Lightning scales len)
            sampler.limit = int(sampler.num_batches * limit)
        self.samplers.append(sampler)
        self.loaders.append(with_batch_sampler(dataloader, sampler, LastBatchKnown))
        return self.loaders[-1]

    # -- the end of training -------------------------------------------------------------------
    def on_train_end(self) -> None:
        """Drain and average: every rank leaves training with the consensus model (and its step-interval
        schedules where the whole job's progress has them: at their end after the last epoch)."""
        super().on_train_end()
        for config in self.lr_scheduler_configs:
            if followed(config.scheduler):
                config.scheduler.step()
        self.finish()

    def finish(self) -> None:
        if self.sync is not None and not self._finished:
            self.sync.finish()
            self._finished = True

    def metrics(self) -> dict:
        """The protocol's metrics for this rank (``sync.metrics()``) and the batches it took last epoch."""
        data = self.sync.metrics() if self.sync is not None else {}
        if self.samplers:
            data["batches_taken_last_epoch"] = self.samplers[-1].taken
        return data

    def on_exception(self, exception: BaseException) -> None:
        if self.sync is not None:
            self.sync.close()
        super().on_exception(exception)

    def teardown(self) -> None:
        if self.sync is not None:
            self.sync.close()  # after finish() this only releases; after an error it does not wait for anyone
        if self.liveness is not None:
            self.liveness.stop()
        if self.model is not self.lightning_module and self.lightning_module is not None:
            self.model = self.lightning_module
        super().teardown()

    # -- Lightning's collectives ---------------------------------------------------------------
    def barrier(self, *args: Any, **kwargs: Any) -> None:
        if not self.decoupled:
            super().barrier(*args, **kwargs)

    def broadcast(self, obj, src: int = 0):
        return obj if self.decoupled else super().broadcast(obj, src)

    def reduce(self, tensor, group=None, reduce_op="mean"):
        return tensor if self.decoupled else super().reduce(tensor, group, reduce_op)

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:  # noqa: A002 (Lightning's name)
        return decision if self.decoupled else super().reduce_boolean_decision(decision, all)


def _training_loader(dataloader: object) -> bool:
    """A training loader whose order is a shuffled pass over its whole dataset, which Lightning sharded
    with a plain DistributedSampler. A loader with a sampler of its own (a subset, weights) is wrapped
    by Lightning in a subclass of DistributedSampler and keeps its static shards: SharedBatches
    walks the whole dataset."""
    return isinstance(dataloader, DataLoader) and type(dataloader.sampler) is DistributedSampler \
        and dataloader.sampler.shuffle and dataloader.batch_size is not None \
        and not isinstance(dataloader.dataset, IterableDataset)


def _fetches_itself(module) -> bool:
    """Whether ``training_step`` takes ``dataloader_iter`` (it draws its batches itself, after
    ``on_train_batch_start``, and Lightning flags the last batch from the loader's end then)."""
    from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature

    return is_param_in_hook_signature(module.training_step, "dataloader_iter", explicit=True)


def _check_sigterm_locally(trainer) -> None:
    """Lightning's epoch loop broadcasts rank 0's SIGTERM flag before every batch (a collective each
    batch); decoupled ranks check their own flag instead (a private method replaced on this trainer's loop)."""
    from packaging.version import Version

    loop = trainer.fit_loop.epoch_loop
    if Version(lightning.__version__) < Version(SIGTERM_BROADCAST_SINCE):
        return  # no per-batch broadcast before Lightning 2.5.2 (each rank checks its own flag already)
    _private(loop, "_broadcast_sigterm_tensor", "the epoch loop's per-batch SIGTERM broadcast")

    def local_check() -> None:
        if getattr(trainer, "received_sigterm", False):
            raise SIGTERMException()

    loop._broadcast_sigterm_tensor = local_check


class _TolerantLauncher(_SubprocessScriptLauncher):
    """Lightning's launcher without its observer, which SIGKILLs every rank when one dies (5 s later):
    with ``on_failure="continue"`` the survivors go on."""

    def launch(self, function, *args, trainer=None, **kwargs):
        from lightning.fabric.utilities.distributed import _set_num_threads_if_needed

        self.cluster_environment.validate_settings(num_devices=self.num_processes, num_nodes=self.num_nodes)
        if not self.cluster_environment.creates_processes_externally:
            self._call_children_scripts()
        _set_num_threads_if_needed(num_processes=self.num_processes)
        return function(*args, **kwargs)


# -- schedules and validation by the whole job's progress (decoupled ranks, batches shared out) ---------
def _private(obj, name: str, what: str):
    """``obj.name``, a private attribute of Lightning's this strategy relies on, or a one-line error
    naming the Lightning version (never a silent fallback)."""
    if not hasattr(obj, name):
        raise UsageError(f"HetrainStrategy relies on {what} ({type(obj).__name__}.{name}), which Lightning "
                         f"{lightning.__version__} does not have; use a Lightning within hetrain's supported "
                         "range (pyproject.toml: lightning>=2.2.5,<2.7)")
    return getattr(obj, name)


def job_steps(strategy: HetrainStrategy, trainer, accumulate: int, frequency: int) -> int | None:
    """Where a step-interval schedule stands for the whole job: runs bounded by ``max_steps`` by the
    steps the protocol counts (they end the run); runs bounded by epochs by the batches taken over all
    ranks (``estimated_stepping_batches`` is the epochs' optimizer steps over all ranks), so every
    rank's schedule reaches its end when training does, whatever its share of the batches."""
    sampler = strategy.samplers[-1] if strategy.samplers else None
    if strategy.sync is None or sampler is None:
        return None
    per_epoch = math.ceil(sampler.num_batches / accumulate)
    by_data = None if trainer.max_epochs in (None, -1) else per_epoch * max(trainer.max_epochs, 1)
    if trainer.max_steps != -1 and (by_data is None or trainer.max_steps <= by_data):
        steps = strategy.sync.stats.iteration
    else:
        steps = sampler.sampler.epoch * per_epoch + sampler.claimed // accumulate
    return steps // max(frequency, 1)


def _schedules_follow_the_job(strategy: HetrainStrategy, trainer) -> None:
    from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

    accumulate = trainer.accumulate_grad_batches
    for config in strategy.lr_scheduler_configs:
        scheduler = config.scheduler
        if config.interval != "step" or not isinstance(scheduler, LRScheduler) \
                or isinstance(scheduler, ReduceLROnPlateau) or followed(scheduler):
            continue
        follow_job(scheduler, lambda frequency=config.frequency: job_steps(strategy, trainer, accumulate, frequency))


def _validate_by_the_jobs_progress(strategy: HetrainStrategy, trainer) -> None:
    """``val_check_interval`` as a fraction: validate when the epoch's batches over all ranks pass each
    multiple of the fraction, and at the epoch's end, as Lightning does for one process. Integers keep
    Lightning's meaning (every so many of this rank's batches)."""
    loop = trainer.fit_loop.epoch_loop
    original = _private(loop, "_should_check_val_fx", "the epoch loop's validation check")
    epoch_due = _private(loop, "_should_check_val_epoch", "the epoch loop's validation check")
    seen = {"epoch": -1, "block": 0}

    def should_check(data_fetcher) -> bool:
        sampler = strategy.samplers[-1] if strategy.samplers else None
        every = trainer.val_check_batch
        if sampler is None or not isinstance(trainer.val_check_interval, float) or not strategy.decoupled \
                or every in (None, float("inf")) or getattr(trainer, "_val_check_time_interval", None) is not None:
            return original(data_fetcher)
        if not epoch_due():
            return False
        if sampler.sampler.epoch != seen["epoch"]:
            seen.update(epoch=sampler.sampler.epoch, block=0)
        if trainer.should_stop and trainer.fit_loop._can_stop_early:
            return True
        if loop.batch_progress.is_last_batch:  # this rank's last batch of the epoch (on_train_batch_start)
            return True
        block = sampler.claimed // every
        if block > seen["block"] and block * every < sampler.num_batches:  # the epoch's end validates anyway
            seen["block"] = block
            return True
        return False

    loop._should_check_val_fx = should_check
