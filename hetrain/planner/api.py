"""The planner's Python entry point.

Example::

    from hetrain.planner import plan_model
    result = plan_model("resnet-50", batch=256, devices_spec="tpu-v3:4,tpu-v2:4")
    print(result.table())                      # plan beside data parallelism, one weird trick, HyPar
    result.plans["plan"].step_s                # predicted seconds per step
    result.json()                              # everything, JSON-ready

``model`` may also be ``torchvision:NAME``, ``gpt:BLOCKSxWIDTH``, an ``nn.Module``
instance (pass ``input_shape``, one sample's shape) or ``module:PATH:Class``;
``devices_spec`` a spec string, a device file path or a list of
:class:`~hetrain.planner.devices.Device`. By default the plan is kept within
every device's memory (weights, gradients, Adam state, kept activations) and
searched level by level; ``search="lookahead"`` looks across levels.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetrain.errors import UsageError
from hetrain.planner import report
from hetrain.planner.baselines import compare
from hetrain.planner.devices import Device, describe, parse_array
from hetrain.planner.hierarchy import SEARCHES, GroupPlan
from hetrain.planner.layers import Net
from hetrain.planner.memory import state_bytes


@dataclass
class PlanResult:
    """The plan and its baselines (``plans`` maps name -> GroupPlan, ``"plan"`` first)."""

    net: Net
    batch: int
    devices: str
    plans: dict[str, GroupPlan]
    settings: dict

    def json(self) -> dict:
        return report.to_json(self.net, self.batch, self.devices, self.plans, self.settings)

    def table(self) -> str:
        return report.table(self.net, self.batch, self.devices, self.plans, self.settings)


def devices(spec) -> list[Device]:
    """A device list from a spec string, a device file path, or a list of Device."""
    if isinstance(spec, str):
        return parse_array(spec)
    return list(spec)


def model(spec, input_shape=None) -> Net:
    """A Net from a zoo name, ``torchvision:NAME``, ``module:PATH:Class``, an ``nn.Module`` instance or a Net."""
    from hetrain.planner import models

    return models.load(spec, input_shape)


def compare_plans(net: Net, batch: int, devs: list[Device], objective: str = "time", types: int = 3,
                  dtype_bytes: float = 2.0, optimizer: str = "adam", fit_memory: bool = True,
                  search: str = "greedy", width: int = 4, depth: int = 1) -> PlanResult:
    if batch < 1:
        raise UsageError(f"batch must be at least 1, got {batch}")
    if search not in SEARCHES:
        raise UsageError(f"search must be one of {', '.join(SEARCHES)}, got {search!r}")
    if width < 1 or depth < 1:
        raise UsageError(f"look-ahead width and depth must be at least 1, got {width} and {depth}")
    options = {"optimizer": optimizer, "state_bytes": state_bytes(optimizer, dtype_bytes), "fit_memory": fit_memory,
               "search": search, "width": width, "depth": depth}
    plans = compare(net, batch, devs, objective, types, dtype_bytes, **options)
    settings = {"objective": objective, "types": types, "dtype_bytes": dtype_bytes, "optimizer": optimizer,
                "memory_enforced": fit_memory, "search": search}
    if search == "lookahead":
        settings.update(width=width, depth=depth)
    return PlanResult(net, batch, describe(devs), plans, settings)


def plan_model(model_spec, batch: int, devices_spec, objective: str = "time", types: int = 3,
               dtype_bytes: float = 2.0, input_shape=None, **options) -> PlanResult:
    """Load the model, parse the array, plan it and its baselines (``options``: see :func:`compare_plans`)."""
    return compare_plans(model(model_spec, input_shape), batch, devices(devices_spec), objective, types,
                         dtype_bytes, **options)
