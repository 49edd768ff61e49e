"""The communication settings every protocol takes, as one object (pure: no torch).

* ``sync_every`` H: local optimizer steps between exchanges (1: every step, the default);
* ``local_work``: ``fixed`` (H steps each) or ``auto`` (steps sized to each worker's speed,
  :mod:`hetrain.comm.local_work`);
* ``compression``: what each message is compressed to (:mod:`hetrain.compression.spec`);
* ``gossip_step``: how far a worker moves toward its neighbours' public copies under
  compression (CHOCO-SGD's consensus step; None: 1 for the quantizers, the compressed
  fraction for topk and powersgd, :meth:`CompressionSpec.default_gossip_step`);
* ``outer``: the outer optimizer applied to the averaged pseudo-gradient
  (``none``, ``sgd`` or ``nesterov``, with ``outer_lr`` and ``outer_momentum``; DiLoCo's
  convention is nesterov, lr 0.7, momentum 0.9);
* ``link``: the emulated network (:mod:`hetrain.transport.link_spec`).

The defaults change nothing: H = 1, no compression, no outer optimizer, no emulation.
Errors name the Python argument (``{sync_every}``; the CLI shows ``--sync-every``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetrain.comm.local_work import MODES
from hetrain.compression.spec import CompressionSpec
from hetrain.protocols.options import OptionError
from hetrain.transport.link_spec import LinkSpec

OUTER_OPTIMIZERS = ("none", "sgd", "nesterov")
DILOCO_OUTER_LR = 0.7
DILOCO_OUTER_MOMENTUM = 0.9


@dataclass(frozen=True)
class CommSettings:
    sync_every: int = 1
    local_work: str = "fixed"
    compression: CompressionSpec = field(default_factory=CompressionSpec)
    gossip_step: float | None = None
    outer: str = "none"
    outer_lr: float = DILOCO_OUTER_LR
    outer_momentum: float = DILOCO_OUTER_MOMENTUM
    link: LinkSpec = field(default_factory=LinkSpec)

    def validate(self) -> CommSettings:
        if not isinstance(self.sync_every, int) or self.sync_every < 1:
            raise OptionError(f"{{sync_every}} must be a positive integer (local steps per exchange), "
                              f"got {self.sync_every!r}")
        if self.local_work not in MODES:
            raise OptionError(f"{{local_work}} must be one of {', '.join(MODES)}, got {self.local_work!r}")
        if self.local_work == "auto" and self.sync_every == 1:
            raise OptionError("{local_work} auto sizes the local steps between exchanges: give {sync_every} H > 1 "
                              "(the fastest worker's steps per exchange)")
        if self.gossip_step is not None and not 0 < self.gossip_step <= 1:
            raise OptionError(f"{{gossip_step}} must be in (0, 1], got {self.gossip_step}")
        if self.outer not in OUTER_OPTIMIZERS:
            raise OptionError(f"{{outer_optimizer}} must be one of {', '.join(OUTER_OPTIMIZERS)}, got {self.outer!r}")
        if not self.outer_lr > 0:
            raise OptionError(f"{{outer_lr}} must be positive, got {self.outer_lr}")
        if not 0 <= self.outer_momentum < 1:
            raise OptionError(f"{{outer_momentum}} must be in [0, 1), got {self.outer_momentum}")
        return self

    @property
    def default(self) -> bool:
        """Whether these settings change nothing (today's protocols, bit for bit)."""
        return (self.sync_every == 1 and not self.compression.enabled and self.outer == "none"
                and not self.link.enabled)

    def describe(self) -> str:
        parts = [f"H={self.sync_every}" + (" (auto)" if self.local_work == "auto" else "")]
        if self.compression.enabled:
            parts.append(f"compress {self.compression}")
        if self.outer != "none":
            parts.append(f"outer {self.outer} lr {self.outer_lr:g} momentum {self.outer_momentum:g}")
        if self.link.enabled:
            parts.append(f"link {self.link.describe()}")
        return ", ".join(parts)

    def as_dict(self) -> dict:
        return {"sync_every": self.sync_every, "local_work": self.local_work, "compression": str(self.compression),
                "gossip_step": self.gossip_step, "outer_optimizer": self.outer, "outer_lr": self.outer_lr,
                "outer_momentum": self.outer_momentum, **self.link.as_dict()}
