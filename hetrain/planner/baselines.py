"""The plan and its baselines, as :class:`~hetrain.planner.hierarchy.PlanConfig` presets.

- ``data-parallel``: every layer type I at every level (batch split everywhere).
- ``one-weird-trick`` (Krizhevsky 2014): convolutions data parallel (type I),
  fully connected layers model parallel by output neurons (type III: each
  device computes its slice of the neurons for the whole batch).
- ``hypar`` (HyPar, HPCA'19): types I/II only, communication volume as the
  objective, halves always split 0.5 (HyPar has no notion of unequal devices),
  level by level.

Data parallelism and one weird trick use the balanced split ratio like the
plan (the cost model's best for them on a heterogeneous array; on tiny models,
where communication is nearly all of the step, that ratio can leave devices
idle, so ``plan --train`` also measures data parallelism at the even split and
keeps the faster); join layouts of residual blocks are chosen optimally for all.
Only the plan is kept within the devices' memory; a baseline that does not fit
is reported as such (``GroupPlan.fits``), with its predicted time all the same.
"""

from __future__ import annotations

from dataclasses import replace

from hetrain.planner.devices import Device
from hetrain.planner.hierarchy import GroupPlan, PlanConfig, plan
from hetrain.planner.layers import Net


def _fixed(name: str, pick, bytes_per_elem: float) -> PlanConfig:
    return PlanConfig(name=name, objective="time", allowed=lambda net: [(pick(la),) for la in net.layers],
                      bytes_per_elem=bytes_per_elem, ratio="balance")


def data_parallel(bytes_per_elem: float = 2.0) -> PlanConfig:
    return _fixed("data-parallel", lambda la: 0, bytes_per_elem)


def one_weird_trick(bytes_per_elem: float = 2.0) -> PlanConfig:
    return _fixed("one-weird-trick", lambda la: 0 if la.kind == "conv" else 2, bytes_per_elem)


def hypar(bytes_per_elem: float = 2.0) -> PlanConfig:
    return PlanConfig(name="hypar", objective="volume", allowed=(0, 1), bytes_per_elem=bytes_per_elem, ratio="equal")


def searched(objective: str = "time", types: int = 3, bytes_per_elem: float = 2.0, **options) -> PlanConfig:
    """The planner's own search: ``types`` 3 (I/II/III, AccPar) or 2 (I/II, HyPar's space).

    ``options``: more :class:`PlanConfig` fields (search, width, depth, optimizer, state_bytes, fit_memory).
    """
    if types not in (2, 3):
        raise ValueError(f"types must be 2 or 3, got {types}")
    allowed = (0, 1, 2) if types == 3 else (0, 1)
    return PlanConfig(name="plan", objective=objective, allowed=allowed, bytes_per_elem=bytes_per_elem, **options)


def compare(net: Net, batch: int, devices: list[Device], objective: str = "time", types: int = 3,
            bytes_per_elem: float = 2.0, **options) -> dict[str, GroupPlan]:
    """The plan and every baseline on the same model, batch and array; ``plan`` first.

    ``options`` configure the plan (see :func:`searched`); the baselines share its memory
    accounting (optimizer state) but are neither searched across levels nor kept within memory.
    """
    main = searched(objective, types, bytes_per_elem, **options)
    memory = {"state_bytes": main.state_bytes, "optimizer": main.optimizer}
    configs = [main] + [replace(cfg, **memory) for cfg in (data_parallel(bytes_per_elem),
                                                           one_weird_trick(bytes_per_elem), hypar(bytes_per_elem))]
    return {cfg.name: plan(net, batch, devices, cfg) for cfg in configs}
