"""Run configuration: one frozen dataclass, validated with one-line UsageErrors."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hetrain.errors import UsageError

PROTOCOLS = ("allreduce", "dpsgd", "hop", "prague", "adpsgd", "ps")
GG_MODES = ("random", "buffer", "division", "static", "smart")
WORKLOADS = ("mlp", "cnn", "synthetic", "lm")
OPTIMIZERS = ("sgd", "adamw")
# What a workload uses when the run does not say: optimizer, its learning rate, seconds between
# model snapshots (accuracy/loss over time), and for lm the validation loss time_to_target_s aims at.
WORKLOAD_DEFAULTS = {
    "mlp": {"optimizer": "sgd", "eval_interval_s": 0.5},
    "cnn": {"optimizer": "sgd", "eval_interval_s": 0.5},
    "synthetic": {"optimizer": "sgd", "eval_interval_s": 0.5},
    "lm": {"optimizer": "adamw", "eval_interval_s": 5.0, "target_loss": 2.5},
}
DEFAULT_LR = {"sgd": 0.1, "adamw": 1e-3}


@dataclass(frozen=True)
class RunConfig:
    """Everything one training run needs; shared by `hetrain train`, `compare` and `simulate`."""

    protocol: str = "hop"
    num_workers: int = 8
    workload: str = "mlp"  # mlp | cnn on digits, synthetic (model size = model_params), lm (byte-level GPT)
    model_params: int = 1_000_000  # synthetic workload only
    batch_size: int = 32
    optimizer: str | None = None  # None: the workload's (sgd; adamw for lm)
    lr: float | None = None  # None: the optimizer's default (sgd 0.1, adamw 1e-3)
    momentum: float = 0.9  # sgd only
    seed: int = 0
    slowdown: str = "none"
    compute_ms: float | None = None
    iterations: int | None = None
    time_budget_s: float | None = None
    target_accuracy: float = 0.95
    target_loss: float | None = None  # lm: time_to_target_s is to this validation loss (None: 2.5 for lm)
    eval_interval_s: float | None = None  # None: the workload's (0.5 s; 5 s for lm)
    device: str = "cpu"
    timeout_s: float = 60.0
    # decentralized (dpsgd, hop)
    topology: str = "ring"
    backup: int | None = None  # None: Hop picks (see hetrain.protocols.hop_config.hop_config_for)
    staleness: int | None = None
    max_ig: int | None = None
    skip_threshold: int | None = None  # 0 switches skipping off
    # prague
    gg: str = "smart"
    group_size: int = 2  # Prague; why 2: docs/prague.md, "Default group size 2"
    communicator_cache: int = 60
    workers_per_node: int | None = None

    def replace(self, **changes) -> RunConfig:
        return dataclasses.replace(self, **changes)

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
        """Check the fields that do not need a topology; raise UsageError naming the fix."""
        if self.protocol not in PROTOCOLS:
            raise UsageError(f"unknown protocol {self.protocol!r}; choose one of {', '.join(PROTOCOLS)}")
        if self.num_workers < 1:
            raise UsageError(f"--workers must be a positive integer, got {self.num_workers}")
        if self.workload not in WORKLOADS:
            raise UsageError(f"unknown workload {self.workload!r}; choose one of {', '.join(WORKLOADS)}")
        if self.batch_size < 1:
            raise UsageError(f"--batch-size must be positive, got {self.batch_size}")
        if self.model_params < 10:
            raise UsageError(f"--model-params must be at least 10, got {self.model_params}")
        if self.compute_ms is not None and self.compute_ms < 0:
            raise UsageError(f"--compute-ms must be >= 0, got {self.compute_ms}")
        if self.iterations is not None and self.iterations < 1:
            raise UsageError(f"--iterations must be positive, got {self.iterations}")
        if self.time_budget_s is not None and self.time_budget_s <= 0:
            raise UsageError(f"--time-budget must be positive seconds, got {self.time_budget_s}")
        if self.iterations is None and self.time_budget_s is None:
            raise UsageError("give --iterations K or --time-budget SECONDS to say when to stop")
        if self.optimizer is not None and self.optimizer not in OPTIMIZERS:
            raise UsageError(f"unknown optimizer {self.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
        if self.lr is not None and not self.lr > 0:
            raise UsageError(f"--lr must be positive, got {self.lr}")
        if self.target_loss is not None and not self.target_loss > 0:
            raise UsageError(f"--target-loss must be positive, got {self.target_loss}")
        if self.eval_interval_s is not None and not self.eval_interval_s > 0:
            raise UsageError(f"--eval-interval must be positive seconds, got {self.eval_interval_s}")
        if not 0 < self.target_accuracy <= 1:
            raise UsageError(f"--target-accuracy must be in (0, 1], got {self.target_accuracy}")
        if self.timeout_s <= 0:
            raise UsageError(f"--timeout must be positive seconds, got {self.timeout_s}")
        if self.device not in ("cpu", "cuda"):
            raise UsageError(f"--device must be cpu or cuda, got {self.device!r}")
        if self.backup is not None and self.backup < 0:
            raise UsageError(f"--backup must be >= 0, got {self.backup}")
        if self.staleness is not None and self.staleness < 0:
            raise UsageError(f"--staleness must be >= 0, got {self.staleness}")
        if self.max_ig is not None and self.max_ig < 1:
            raise UsageError(f"--max-ig must be >= 1 (each edge needs at least one token), got {self.max_ig}")
        if self.skip_threshold is not None and self.skip_threshold < 0:
            raise UsageError(f"--skip-threshold must be >= 1 (or 0 to switch skipping off), got {self.skip_threshold}")
        if self.gg not in GG_MODES:
            raise UsageError(f"unknown --gg mode {self.gg!r}; choose one of {', '.join(GG_MODES)}")
        if self.protocol == "prague" and not 1 <= self.group_size <= self.num_workers:
            raise UsageError(
                f"--group-size must be between 1 and the number of workers ({self.num_workers}), got {self.group_size}"
            )
        if self.communicator_cache < 1:
            raise UsageError(f"--communicator-cache must be >= 1, got {self.communicator_cache}")
        if self.workers_per_node is not None and self.workers_per_node < 1:
            raise UsageError(f"--workers-per-node must be >= 1, got {self.workers_per_node}")
        return self
