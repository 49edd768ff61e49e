"""The communication settings every protocol takes, as one object (pure: no torch).

* ``sync_every`` H: local optimizer steps between exchanges (1: every step, the default);
* ``local_work``: ``fixed`` (H steps each) or ``auto`` (steps sized to each worker's speed,
  :mod:`hetrain.comm.local_work`);
* ``compression``: what each message is compressed to (:mod:`hetrain.compression.spec`);
* ``gossip_step``: how far a worker moves toward its neighbours' public copies under
  compression (CHOCO-SGD's consensus step; None: 1 for the quantizers, the compressed
  fraction for topk and powersgd, :meth:`CompressionSpec.default_gossip_step`);
* ``outer_optimizer``: the outer optimizer applied to the averaged pseudo-gradient (``none``,
  ``sgd`` or ``nesterov``, with ``outer_lr`` and ``outer_momentum``, whose defaults follow the
  optimizer inside (:func:`outer_defaults`: DiLoCo's lr 0.7, momentum 0.9 with AdamW; SlowMo's lr 1,
  momentum 0.5 with SGD); from Python also a ``torch.optim.Optimizer`` over the model);
* ``link_mbps``, ``link_latency_ms``: the emulated network (:mod:`hetrain.transport.link_spec`).

**Each setting is declared once, here**: its field carries its default, its help text, its flag and
whether a checkpoint's protocol state depends on it. The command line's flags
(:func:`hetrain.commands.run_options.add_comm_options`), the run's configuration
(``RunConfig.comm``, by Python name, as ``RunConfig.options``), the resume fingerprint
(:func:`hetrain.jobs.checkpoint.fingerprint`), the metrics record and the protocols' keyword
arguments (:meth:`CommSettings.from_keywords`) all derive from these fields, and a protocol shell
receives the object whole. Adding a setting is its field here, its use in the runtime shell, and its
use in the simulator (docs/concepts/protocol-anatomy.md), and its keyword in each public class's ``def``
(its default read from the field: ``sync_every: int = CommSettings.sync_every``).

The defaults change nothing: H = 1, no compression, no outer optimizer, no emulation.
Errors name the Python argument (``{sync_every}``; the CLI shows ``--sync-every``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from hetrain.comm.local_work import MODES
from hetrain.compression.spec import CompressionSpec
from hetrain.protocols.options import OptionError
from hetrain.transport.link_spec import LinkSpec

OUTER_OPTIMIZERS = ("none", "sgd", "nesterov")
DILOCO_OUTER_LR = 0.7  # DiLoCo (Douillard et al., 2023): AdamW inside, hundreds of local steps
DILOCO_OUTER_MOMENTUM = 0.9
SLOWMO_OUTER_LR = 1.0  # SlowMo (Wang et al., ICLR 2020), fairscale's SlowMoDistributedDataParallel defaults: SGD inside
SLOWMO_OUTER_MOMENTUM = 0.5


def outer_defaults(inner: str | None) -> tuple[float, float]:
    """The outer (lr, momentum) of a run that names neither: SlowMo's with SGD inside (``inner`` "sgd"), else
    DiLoCo's (Adam-family inside, or none known). With SGD inside, DiLoCo's momentum 0.9 multiplied each outer
    step by about 7 and ended at 3-5x plain averaging's loss on the digits MLP (docs/decisions/outer-step-off-the-complete-graph.md, "The outer
    defaults follow the optimizer inside")."""
    if inner is not None and inner.lower() == "sgd":
        return SLOWMO_OUTER_LR, SLOWMO_OUTER_MOMENTUM
    return DILOCO_OUTER_LR, DILOCO_OUTER_MOMENTUM


def comm_option(default: Any, *, help: str, type: type = int, choices: tuple | None = None,  # noqa: A002
                flag: str | None = None, metavar: str | None = None, state: bool = True) -> Any:
    """A communication setting: a dataclass field that is also a flag (``flag``, default
    ``--name-with-dashes``); ``state``: a checkpoint's protocol state depends on it (a resume must match)."""
    return field(default=default, metadata={"help": help, "type": type, "choices": choices, "flag": flag,
                                            "metavar": metavar, "state": state})


@dataclass(frozen=True)
class CommSettings:
    """One worker's communication settings (see the module docstring); ``validate()`` checks them."""

    sync_every: int = comm_option(
        1, metavar="H", help="local optimizer steps between exchanges (default 1); what is exchanged is then the "
                             "model's change since the last exchange (the pseudo-gradient)")
    local_work: str = comm_option(
        "fixed", type=str, choices=MODES,
        help="fixed: H local steps each; auto: steps proportional to each worker's measured speed (the fastest "
             "takes H), averages weighted by steps")
    outer_optimizer: Any = comm_option(
        "none", type=str, choices=OUTER_OPTIMIZERS,
        help="optimizer applied to the averaged pseudo-gradient (DiLoCo: nesterov); none: plain averaging")
    outer_lr: float | None = comm_option(
        None, type=float, help="outer learning rate (default: 1 with SGD inside, SlowMo's; 0.7 with AdamW, DiLoCo's)")
    outer_momentum: float | None = comm_option(
        None, type=float, help="outer momentum (default: 0.5 with SGD inside, SlowMo's; 0.9 with AdamW, DiLoCo's)")
    compression: CompressionSpec = comm_option(
        "none", type=str, flag="--compress",
        help="none | bf16 | int8 | int4 | topk:FRACTION | powersgd:RANK, with error feedback (allreduce: none, bf16, "
             "powersgd:RANK)")
    gossip_step: float | None = comm_option(
        None, type=float, help="with compression: how far a worker moves toward its neighbours' copies (CHOCO's "
                               "step; default 1, or the compressed fraction for topk and powersgd)")
    link_mbps: str | None = comm_option(
        None, type=str, metavar="SPEC", state=False,
        help="emulate each worker's link: Mbit/s each way, e.g. 100 or 0:50,*:1000 (default: unconstrained)")
    link_latency_ms: str | None = comm_option(
        None, type=str, metavar="SPEC", state=False,
        help="emulated one-way latency per worker, e.g. 20 or 0:80,*:1 (a message takes the larger of its two ends')")

    def __post_init__(self) -> None:  # the texts a flag gives, parsed once (UsageError on a malformed one)
        object.__setattr__(self, "compression", CompressionSpec.parse(self.compression))
        object.__setattr__(self, "_link", LinkSpec.parse(self.link_mbps, self.link_latency_ms))

    @classmethod
    def from_keywords(cls, link: LinkSpec | str | float | None = None, **values) -> CommSettings:
        """From a protocol's keyword arguments (``hetrain.Hop(model, opt, sync_every=4, ...)``): the fields by
        name, and ``link`` as a :class:`LinkSpec` (or its ``--link-mbps`` text) for the two link fields."""
        if link is not None:
            spec = link if isinstance(link, LinkSpec) else LinkSpec.parse(link)
            values.update(link_mbps=spec.mbps_text, link_latency_ms=spec.latency_text)
        return cls(**values)

    @property
    def link(self) -> LinkSpec:
        """The emulated network these settings describe."""
        return self._link

    @property
    def outer_named(self) -> str:
        """The outer optimizer's name: none, sgd, nesterov, or ``custom`` (an optimizer object given from Python)."""
        return self.outer_optimizer if isinstance(self.outer_optimizer, str) else "custom"

    def for_inner(self, inner: str | None) -> CommSettings:
        """These settings with the outer lr and momentum not given set to ``inner``'s defaults (the optimizer
        inside: ``sgd``, ``adamw``, ...; :func:`outer_defaults`); unchanged without a named outer optimizer."""
        if self.outer_named not in ("sgd", "nesterov") or None not in (self.outer_lr, self.outer_momentum):
            return self
        lr, momentum = outer_defaults(inner)
        return dataclasses.replace(self, outer_lr=lr if self.outer_lr is None else self.outer_lr,
                                   outer_momentum=momentum if self.outer_momentum is None else self.outer_momentum)

    @property
    def resolved_outer_lr(self) -> float:
        return DILOCO_OUTER_LR if self.outer_lr is None else self.outer_lr

    @property
    def resolved_outer_momentum(self) -> float:
        return DILOCO_OUTER_MOMENTUM if self.outer_momentum is None else self.outer_momentum

    def validate(self, num_workers: int | None = None) -> CommSettings:
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
        if isinstance(self.outer_optimizer, str):
            if self.outer_optimizer not in OUTER_OPTIMIZERS:
                raise OptionError(f"{{outer_optimizer}} must be one of {', '.join(OUTER_OPTIMIZERS)}, "
                                  f"got {self.outer_optimizer!r}")
        elif not (hasattr(self.outer_optimizer, "step") and hasattr(self.outer_optimizer, "param_groups")):
            raise OptionError("{outer_optimizer} must be none, sgd, nesterov or a torch.optim.Optimizer over the "
                              f"model's parameters, got {type(self.outer_optimizer).__name__}")
        if not self.resolved_outer_lr > 0:
            raise OptionError(f"{{outer_lr}} must be positive, got {self.outer_lr}")
        if not 0 <= self.resolved_outer_momentum < 1:
            raise OptionError(f"{{outer_momentum}} must be in [0, 1), got {self.outer_momentum}")
        if num_workers is not None:
            self.link.check_workers(num_workers)
        return self

    @property
    def default(self) -> bool:
        """Whether these settings change nothing (today's protocols, bit for bit)."""
        return (self.sync_every == 1 and not self.compression.enabled and self.outer_named == "none"
                and not self.link.enabled)

    def describe(self) -> str:
        parts = [f"H={self.sync_every}" + (" (auto)" if self.local_work == "auto" else "")]
        if self.compression.enabled:
            parts.append(f"compress {self.compression}")
        if self.outer_named != "none":
            parts.append(f"outer {self.outer_named} lr {self.resolved_outer_lr:g} "
                         f"momentum {self.resolved_outer_momentum:g}")
        if self.link.enabled:
            parts.append(f"link {self.link.describe()}")
        return ", ".join(parts)

    def as_dict(self) -> dict:
        """Every setting, resolved (the simulator's metrics and the fingerprint's record), by field name."""
        return {f.name: self._resolved(f.name) for f in comm_fields()}

    def given(self) -> dict:
        """Every setting as given (None: its default), by field name: the run configuration's record."""
        return {f.name: self._resolved(f.name) if f.name in ("compression", "outer_optimizer") else getattr(self, f.name)
                for f in comm_fields()}

    def _resolved(self, name: str):
        if name == "compression":
            return str(self.compression)
        if name == "outer_optimizer":
            return self.outer_named
        if name in ("outer_lr", "outer_momentum"):
            return getattr(self, "resolved_" + name)
        if name in ("link_mbps", "link_latency_ms"):
            return self.link.as_dict()[name]
        return getattr(self, name)


def comm_fields() -> list[dataclasses.Field]:
    """The communication settings, in declaration order: one flag each."""
    return list(dataclasses.fields(CommSettings))


def state_settings() -> dict[str, str]:
    """The settings a checkpoint's protocol state depends on, with their flags (the resume fingerprint)."""
    return {f.name: flag_of(f) for f in comm_fields() if f.metadata["state"]}


def flag_of(setting: dataclasses.Field) -> str:
    return setting.metadata["flag"] or "--" + setting.name.replace("_", "-")
