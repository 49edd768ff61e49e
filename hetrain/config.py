"""Run configuration: one frozen dataclass for a training run, validated with one-line errors.

Run-level settings are fields; the protocol's own settings are ``options``, a
mapping by Python argument name (``{"backup": 1, "max_ig": 8}``) that the
protocol's options class (:mod:`hetrain.registry`) validates and fills with
its defaults; the communication settings are ``comm``, the same kind of mapping
(``{"sync_every": 8, "compression": "int8"}``) for
:class:`~hetrain.comm.settings.CommSettings`. A config resolves its protocol's spec and options object once
(``protocol_spec``, ``protocol_options()``) and asks the options object the
protocol's rules; it names no protocol. Errors name the Python field
(``num_workers``); the CLI shows them as flags (``--workers``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from hetrain.comm import settings as comm_carrier
from hetrain.protocols.options import OptionError

WORKLOADS = ("mlp", "cnn", "synthetic", "lm")
OPTIMIZERS = ("sgd", "adamw")
DATA_SPLITS = ("balanced", "shard", "whole")  # what each worker samples from (hetrain.data.make_sampler)
# What a workload uses when the run does not say: optimizer, its learning rate, seconds between
# model snapshots (accuracy/loss over time), and for lm the validation loss time_to_target_s aims at.
WORKLOAD_DEFAULTS = {
    "mlp": {"optimizer": "sgd", "eval_interval_s": 0.5},
    "cnn": {"optimizer": "sgd", "eval_interval_s": 0.5},
    "synthetic": {"optimizer": "sgd", "eval_interval_s": 0.5},
    "lm": {"optimizer": "adamw", "eval_interval_s": 5.0, "target_loss": 2.5},
}
DEFAULT_LR = {"sgd": 0.1, "adamw": 1e-3}
# CLI flags whose names differ from the Python field (the rest are --field-with-dashes)
FLAG_NAMES = {"num_workers": "--workers", "time_budget_s": "--time-budget", "eval_interval_s": "--eval-interval",
              "timeout_s": "--timeout", "checkpoint_every_s": "--checkpoint-every",
              "heartbeat_timeout_s": "--heartbeat-timeout",
              **{f.name: comm_carrier.flag_of(f) for f in comm_carrier.comm_fields() if f.metadata["flag"]}}


@dataclass(frozen=True)
class RunConfig:
    """Everything one training run needs; shared by `hetrain train`, `compare` and `simulate`."""

    protocol: str = "hop"
    num_workers: int = 8
    workload: str = "mlp"  # mlp | cnn on digits, synthetic (model size = model_params), lm (byte-level GPT)
    model_params: int = 1_000_000  # synthetic workload only
    batch_size: int = 32
    data_split: str = "balanced"  # shard: each worker its rank::world slice; balanced: and the slow workers'
    # slices while it is fast (shard_balance.py); whole: every worker the whole set (data.py)
    optimizer: str | None = None  # None: the workload's (sgd; adamw for lm)
    lr: float | None = None  # None: the optimizer's default (sgd 0.1, adamw 1e-3)
    momentum: float = 0.9  # sgd only
    seed: int = 0
    slowdown: str = "none"
    compute_ms: float | None = None  # emulated compute per iteration; None or 0: real compute
    iterations: int | None = None
    time_budget_s: float | None = None
    target_accuracy: float = 0.95
    target_loss: float | None = None  # lm: time_to_target_s is to this validation loss (None: 2.5 for lm)
    eval_interval_s: float | None = None  # None: the workload's (0.5 s; 5 s for lm)
    device: str = "cpu"
    backend: str | None = None  # nccl | gloo; None: nccl for cuda, gloo for cpu (gloo with cuda: through the host)
    timeout_s: float = 60.0
    heartbeat_timeout_s: float = 30.0  # a local worker silent this long is hung (0: never; hetrain.jobs.heartbeat)
    checkpoint_dir: str | None = None  # each worker's state is written here (atomically)
    checkpoint_every_s: float | None = None  # None: only at the end (when checkpoint_dir is set)
    resume: bool = False  # continue from checkpoint_dir's checkpoints (a fresh start when it has none)
    fail: str = "none"  # fault injection: none | W@Ts | W@wall:Ts | W@PHASE, [:stop] | random:rate=R (hetrain.faults)
    on_failure: str | None = None  # abort | continue | respawn; None: the protocol's default (registry)
    max_workers: int | None = None  # the job may grow to this many workers (None: num_workers, fixed)
    join: str = "none"  # K@Ts[,L@Us]: K new workers T s into training (hetrain.join_spec; needs max_workers)
    options: dict[str, Any] = field(default_factory=dict)  # the protocol's options, by Python name
    # communication (hetrain.comm.settings.CommSettings): local steps, outer optimizer, compression, emulated
    # links, by Python name, as given (the rest: CommSettings' defaults)
    comm: dict[str, Any] = field(default_factory=dict)
    # where the run's figures over time go: csv, tensorboard, wandb, mlflow (hetrain.loggers.scalar_writers)
    log: tuple[str, ...] = ("csv",)

    def replace(self, **changes) -> RunConfig:
        return dataclasses.replace(self, **changes)

    # The fields live in the instance __dict__ (``vars(config)`` is the run's settings); what the config
    # resolved once (its spec, its options object) lives in a slot beside it, out of ``vars``. A copy
    # (``replace``, or a config pickled to a worker) resolves afresh.
    __slots__ = ("__dict__", "_resolved")

    def __getstate__(self) -> dict:
        return dict(self.__dict__)  # the fields only (unpickling puts them back in __dict__)

    def _once(self, key: str, make):
        try:
            resolved = self._resolved
        except AttributeError:
            resolved = {}
            object.__setattr__(self, "_resolved", resolved)  # frozen: the fields, not this cache
        if key not in resolved:
            resolved[key] = make()
        return resolved[key]

    @property
    def protocol_spec(self):
        """The registry's :class:`~hetrain.registry.ProtocolSpec` of ``protocol`` (UsageError if unknown)."""
        from hetrain.registry import get_spec

        return self._once("spec", lambda: get_spec(self.protocol))

    def _options_with_defaults(self):
        """The protocol's options object from ``options``, defaults filled in, not yet validated."""
        return self._once("options", lambda: self.protocol_spec.make_options(self.options))

    def comm_settings(self):
        """The run's :class:`~hetrain.comm.settings.CommSettings` (validated; UsageError naming the flag)."""
        def make():
            names = [f.name for f in comm_carrier.comm_fields()]
            unknown = sorted(set(self.comm) - set(names))
            if unknown:
                raise OptionError(f"no communication setting {unknown[0]!r}; they are {', '.join(names)}")
            # an outer lr and momentum not given follow the workload's optimizer (SlowMo's with SGD, DiLoCo's with AdamW)
            return comm_carrier.CommSettings(**self.comm).for_inner(self.resolved_optimizer()).validate(self.world_size)

        return self._once("comm", make)

    def record(self) -> dict:
        """The run's settings as a flat record (metrics.json's ``config``): the fields, the communication
        settings in place of ``comm`` (each as given; None: its default)."""
        data = dict(vars(self))
        data.pop("comm")
        data.update(self.comm_settings().given())
        return data

    def resolved_optimizer(self) -> str:
        return self.optimizer or WORKLOAD_DEFAULTS[self.workload]["optimizer"]

    def resolved_lr(self) -> float:
        return self.lr if self.lr is not None else DEFAULT_LR[self.resolved_optimizer()]

    def resolved_eval_interval_s(self) -> float:
        return self.eval_interval_s or WORKLOAD_DEFAULTS[self.workload]["eval_interval_s"]

    def resolved_target_loss(self) -> float | None:
        """The validation loss time_to_target_s aims at; None means the run aims at target_accuracy."""
        return self.target_loss if self.target_loss is not None else WORKLOAD_DEFAULTS[self.workload].get("target_loss")

    def validate(self) -> RunConfig:
        """Check the run-level fields and the protocol's options; raise OptionError naming the fix."""
        spec = self.protocol_spec
        if self.num_workers < 1:
            raise OptionError(f"{{num_workers}} must be a positive integer, got {self.num_workers}")
        if self.workload not in WORKLOADS:
            raise OptionError(f"unknown {{workload}} {self.workload!r}; choose one of {', '.join(WORKLOADS)}")
        for name, minimum in (("batch_size", 1), ("model_params", 10), ("iterations", 1)):
            value = getattr(self, name)
            if value is not None and value < minimum:
                raise OptionError(f"{{{name}}} must be at least {minimum}, got {value}")
        if self.data_split not in DATA_SPLITS:
            raise OptionError(f"unknown {{data_split}} {self.data_split!r}; choose one of {', '.join(DATA_SPLITS)}")
        if self.compute_ms is not None and not 0 <= self.compute_ms < math.inf:  # NaN fails the comparison
            raise OptionError(f"{{compute_ms}} must be a number >= 0, got {self.compute_ms}")
        for name in ("time_budget_s", "lr", "target_loss", "eval_interval_s", "timeout_s", "checkpoint_every_s"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:
                raise OptionError(f"{{{name}}} must be a positive number, got {value}")
        if self.momentum is not None and not 0 <= self.momentum < 1:
            raise OptionError(f"{{momentum}} must be in [0, 1), got {self.momentum}")
        from hetrain.jobs.heartbeat import HEARTBEAT_INTERVAL_S

        least = 3 * HEARTBEAT_INTERVAL_S  # a worker beats every interval: a shorter silence is no sign of a hang
        if not (self.heartbeat_timeout_s == 0 or least <= self.heartbeat_timeout_s < math.inf):
            raise OptionError(f"{{heartbeat_timeout_s}} must be 0 (off) or at least {least:.0f} s (a worker beats "
                              f"every {HEARTBEAT_INTERVAL_S:.0f} s), got {self.heartbeat_timeout_s}")
        if self.iterations is None and self.time_budget_s is None:
            raise OptionError("give {iterations} or {time_budget_s} to say when to stop")
        if self.optimizer is not None and self.optimizer not in OPTIMIZERS:
            raise OptionError(f"unknown {{optimizer}} {self.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
        if not 0 < self.target_accuracy <= 1:
            raise OptionError(f"{{target_accuracy}} must be in (0, 1], got {self.target_accuracy}")
        from hetrain.faults import parse_fail
        from hetrain.protocols.membership import ON_FAILURE

        parse_fail(self.fail, self.seed).check_workers(self.world_size, repeats=self.on_failure == "respawn")
        if self.on_failure is not None and self.on_failure not in ON_FAILURE:
            raise OptionError(f"unknown {{on_failure}} {self.on_failure!r}; choose one of {', '.join(ON_FAILURE)}")
        if self.on_failure is not None:
            self._options_with_defaults().check_on_failure(self.on_failure)
        self._check_membership()
        if (self.checkpoint_every_s is not None or self.resume) and not self.checkpoint_dir:
            raise OptionError("{checkpoint_every_s} and {resume} need {checkpoint_dir}: where checkpoints live")
        if self.device not in ("cpu", "cuda"):
            raise OptionError(f"{{device}} must be cpu or cuda, got {self.device!r}")
        if self.backend not in (None, "nccl", "gloo"):
            raise OptionError(f"{{backend}} must be nccl or gloo, got {self.backend!r}")
        if self.backend == "nccl" and self.device != "cuda":
            raise OptionError("{backend} nccl runs on GPUs: add {device} cuda, or use {backend} gloo on the CPU")
        if self.resolved_backend() == "nccl":
            self._check_nccl(spec)
        from hetrain.loggers.scalar_writers import check_log_kinds

        check_log_kinds(self.log)
        unknown = sorted(set(self.options) - set(spec.option_names()))
        if unknown:
            raise OptionError(f"{self.protocol} takes no option {unknown[0]!r}; it takes "
                              f"{', '.join(spec.option_names()) or 'none'}")
        self.protocol_options().check_comm(self.comm_settings())
        return self

    @property
    def world_size(self) -> int:
        """The job's ranks: its largest size (``max_workers``), of which ``num_workers`` start."""
        return self.max_workers or self.num_workers

    @property
    def elastic(self) -> bool:
        """Whether workers may join beyond the starting size."""
        return self.world_size > self.num_workers

    @property
    def deals_epochs(self) -> bool:
        """Whether each epoch's batches are dealt out over the members (hetrain.epoch_deal): a job that may grow,
        with the balanced split, on a dataset of examples (the LM's windows are drawn at random: no epochs)."""
        return self.elastic and self.data_split == "balanced" and self.workload != "lm"

    def _check_membership(self) -> None:
        """What a job that may grow needs (docs/decisions/elastic-membership.md)."""
        from hetrain.join_spec import parse_join

        if self.max_workers is not None and self.max_workers < self.num_workers:
            raise OptionError(f"{{max_workers}} ({self.max_workers}) must be at least {{num_workers}} "
                              f"({self.num_workers}): the job starts with {{num_workers}} and grows to {{max_workers}}")
        joins = parse_join(self.join)
        room = self.world_size - self.num_workers
        if joins.total and not room:
            raise OptionError(f"{{join}} adds {joins.total} worker(s) to a job that cannot grow: give {{max_workers}} "
                              f"(e.g. {{max_workers}} {self.num_workers + joins.total})")
        if not self.elastic:
            return
        options = self._options_with_defaults()
        if not options.supports_respawn():
            raise OptionError(f"{self.protocol} cannot admit workers into a running job ({{max_workers}}): its "
                              "members are fixed when it starts; use hop, dpsgd, prague or adpsgd")
        if self.resolved_backend() == "nccl":
            raise OptionError("{max_workers} needs gloo: NCCL's communicators are fixed when they are built; "
                              "use {backend} gloo")
        if self.data_split == "shard":
            raise OptionError("{max_workers} needs {data_split} balanced (the default): with shard, the data of "
                              "the workers not yet joined would go untrained")

    def worker_on_failure(self) -> str:
        """What the workers' protocols are built for, beside what the launcher does on a death
        (``resolved_on_failure``): ``respawn`` where new members may join; ``continue`` where the launcher
        aborts on a death but the protocol can route around a worker that leaves gracefully."""
        policy = self.resolved_on_failure()
        if self.resolved_backend() == "nccl":
            return policy
        if self.elastic:
            return "respawn"
        if policy == "abort" and self._options_with_defaults().default_on_failure() != "abort":
            return "continue"
        return policy

    def resolved_backend(self) -> str:
        """The process group's backend: ``backend``, or NCCL on GPUs and gloo on the CPU."""
        return self.backend or ("nccl" if self.device == "cuda" else "gloo")

    def _check_nccl(self, spec) -> None:
        """What NCCL cannot do is refused here, naming the way out (docs/decisions/gpu-path.md)."""
        if self.on_failure in ("continue", "respawn"):
            raise OptionError(f"{{on_failure}} {self.on_failure} cannot work on NCCL: its watchdog tears down "
                              "a process whose peer died; use {on_failure} abort (with checkpoints to restart "
                              "from), or {backend} gloo")

    def resolved_on_failure(self) -> str:
        """``on_failure``, or the protocol's default for these options (abort on NCCL: a death ends the job)."""
        if self.on_failure:
            return self.on_failure
        return "abort" if self.resolved_backend() == "nccl" else self._options_with_defaults().default_on_failure()

    def protocol_options(self):
        """The protocol's options object (defaults filled in), validated for this run's workers; built once."""
        return self._once("validated", lambda: self._options_with_defaults().validate(self.world_size))
