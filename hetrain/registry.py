"""The protocol registry: one :class:`ProtocolSpec` per protocol, from which everything else is derived.

``hetrain train``/``compare``/``simulate`` take their protocol choices and
flags from here, the Python API's classes are the specs' ``runtime`` targets,
and the simulator builds each protocol from its ``simulator`` target. Adding a
protocol means one options class (pure, beside its logic), one runtime shell,
one simulated shell and one entry below.

Importing this module imports no torch: the runtime and simulator targets are
``"module:attribute"`` strings resolved on use.

A protocol's settings travel as one object: ``make_options`` builds its
options class once, and ``build``, ``make_scheduler`` and the simulator
factory take that object as it is. The protocol's rules (its default failure
mode, whether a replacement may join) are methods of the options class
(:class:`hetrain.protocols.options.ProtocolOptions`), so nothing outside the
options classes and the table below names a protocol.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any

from hetrain.errors import UsageError
from hetrain.protocols.adpsgd_pairing import ADPSGDOptions
from hetrain.protocols.allreduce_options import AllReduceOptions
from hetrain.protocols.hop_config import DPSGDOptions, HopOptions
from hetrain.protocols.options import ProtocolOptions, option_fields, options_from
from hetrain.protocols.prague_options import PragueOptions
from hetrain.protocols.ps_logic import PSOptions

__all__ = ["PROTOCOLS", "PROTOCOL_NAMES", "AllReduceOptions", "ProtocolSpec", "all_option_fields", "get_spec",
           "protocols_using"]


@dataclass(frozen=True)
class ProtocolSpec:
    """A protocol: its name, options class, runtime class and simulator factory.

    ``options`` is a :class:`~hetrain.protocols.options.ProtocolOptions`
    dataclass: the protocol's settings and its rules. ``runtime`` names a
    :class:`hetrain.runtime.protocol.SyncProtocol` subclass that takes the
    options object as ``options=``; ``simulator`` names
    ``factory(setup, options, seed)`` returning an object with ``run()``.
    ``seeded``: the runtime class takes ``seed`` (random group formation).
    ``scheduler`` names ``function(num_workers, options, seed)``: the Group
    Generator a launcher serves (unless the options compute their groups
    locally, ``options.local_schedule``).
    """

    name: str
    summary: str
    options: type[ProtocolOptions]
    runtime: str
    simulator: str
    seeded: bool = False
    scheduler: str | None = None

    def make_options(self, values: dict | None = None, num_workers: int | None = None) -> Any:
        """This protocol's options from ``values`` (Python names; others ignored), validated if ``num_workers``."""
        options = options_from(self.options, values or {})
        return options.validate(num_workers) if num_workers is not None else options

    def option_names(self) -> list[str]:
        return [f.name for f in option_fields(self.options)]

    def runtime_class(self) -> type:
        return _resolve(self.runtime)

    def build(self, model, optimizer, options, *, seed: int = 0, process_group=None, timeout_s: float = 60.0,
              **runtime):
        """The runtime protocol for this worker (collective: every member of the group calls it).

        ``options``: this protocol's options object, passed through as it is. ``runtime``:
        keyword arguments of the runtime class beyond the options (``on_failure``,
        ``dead_workers``, ``gg_address``); ``gg_address`` only reaches protocols with a scheduler.
        """
        if not isinstance(options, self.options):
            raise TypeError(f"{self.name} takes {self.options.__name__}, got {type(options).__name__}")
        if self.seeded:
            runtime["seed"] = seed
        if self.scheduler is None:
            runtime.pop("gg_address", None)
        return self.runtime_class()(model, optimizer, options=options, process_group=process_group,
                                    timeout_s=timeout_s, **runtime)

    def make_scheduler(self, num_workers: int, options, seed: int = 0):
        """The Group Generator a launcher serves for this protocol (None: it has none, or computes it locally)."""
        if self.scheduler is None or options.local_schedule:
            return None
        return _resolve(self.scheduler)(num_workers, options, seed)

    def simulator_factory(self):
        return _resolve(self.simulator)


PROTOCOLS: dict[str, ProtocolSpec] = {
    spec.name: spec
    for spec in (
        ProtocolSpec("allreduce", "synchronous baseline: PyTorch's DistributedDataParallel", AllReduceOptions,
                     "hetrain.runtime.allreduce:AllReduce", "hetrain.sim.allreduce_sim:make_sim"),
        ProtocolSpec("dpsgd", "decentralized: every iteration waits for every in-neighbour", DPSGDOptions,
                     "hetrain.runtime.hop:DPSGD", "hetrain.sim.hop_sim:make_sim"),
        ProtocolSpec("hop", "Hop: update/token queues, backup workers, staleness, skipping", HopOptions,
                     "hetrain.runtime.hop:Hop", "hetrain.sim.hop_sim:make_sim"),
        ProtocolSpec("prague", "Prague: P-Reduce in groups from a Group Generator", PragueOptions,
                     "hetrain.runtime.prague:Prague", "hetrain.sim.prague_sim:make_prague_sim", seeded=True,
                     scheduler="hetrain.protocols.prague_options:scheduler_for"),
        ProtocolSpec("adpsgd", "AD-PSGD: atomic pairwise averaging, active/passive split", ADPSGDOptions,
                     "hetrain.runtime.adpsgd:ADPSGD", "hetrain.sim.prague_sim:make_adpsgd_sim", seeded=True,
                     scheduler="hetrain.protocols.adpsgd_pairing:scheduler_for"),
        ProtocolSpec("ps", "parameter server on rank 0 (synchronous, or asynchronous with staleness)", PSOptions,
                     "hetrain.runtime.parameter_server:ParameterServer", "hetrain.sim.ps_sim:make_sim"),
    )
}
PROTOCOL_NAMES = tuple(PROTOCOLS)


def get_spec(name: str) -> ProtocolSpec:
    try:
        return PROTOCOLS[name]
    except KeyError:
        raise UsageError(f"unknown protocol {name!r}; choose one of {', '.join(PROTOCOL_NAMES)}") from None


def all_option_fields() -> dict[str, dataclasses.Field]:
    """Every protocol option by Python name (the first declaration wins; help texts name protocols)."""
    fields: dict[str, dataclasses.Field] = {}
    for spec in PROTOCOLS.values():
        for f in option_fields(spec.options):
            fields.setdefault(f.name, f)
    return fields


def protocols_using(name: str) -> list[str]:
    return [spec.name for spec in PROTOCOLS.values() if name in spec.option_names()]


def _resolve(target: str):
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)
