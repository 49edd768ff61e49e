"""Memory per device, and how the planner keeps a plan inside each device's capacity.

**What counts.** A device holds, for every weighted layer, its share of the
weight (``bytes_per_elem`` per element), of the weight gradient (same), of the
optimizer state (``state_bytes`` per weight element: 0 for SGD, one buffer for
momentum, two for Adam, 12 for mixed-precision Adam's fp32 master copy and
moments) and of the layer's input, kept for the backward pass (activations
at ``bytes_per_elem``). Not counted: workspace, temporary buffers,
fragmentation, embedding tables that are not a layer (GPT's position table).
A type-I split divides the activations only (weights replicated), type II
divides both, type III the weights only (the full input is kept).

**The constraint.** The level DP sees one level only, while memory depends on
every level's choices. So the DP's per-layer term gets a penalty, ``lam`` times
the bytes this split leaves replicated on both halves (type I: the weight, its
gradient and optimizer state; type III: the kept input; type II: nothing), and
:func:`fit` searches the smallest ``lam`` whose plan fits: ``lam = 0`` is the
unconstrained plan, a huge ``lam`` splits everything (type II everywhere where
allowed), which minimises every device's memory at once. If even that plan
does not fit, nothing does (for equal halves this is exact: type II halves both
a layer's weight and input at every level), and :class:`NoFit` says by how much.
Unequal halves also move their ratio until both sides fit (:mod:`hetrain.planner.hierarchy`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetrain.errors import UsageError

GIB = 2**30
OPTIMIZERS = ("sgd", "momentum", "adam", "adam-mixed")


def state_bytes(optimizer: str, bytes_per_elem: float) -> float:
    """Optimizer state bytes per weight element."""
    if optimizer not in OPTIMIZERS:
        raise UsageError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    return {"sgd": 0.0, "momentum": bytes_per_elem, "adam": 2.0 * bytes_per_elem, "adam-mixed": 12.0}[optimizer]


def need_bytes(shapes, net, bytes_per_elem: float, state: float) -> float:
    """Bytes one device holds with these (leaf) shapes: weights, gradients, optimizer state, kept inputs."""
    total = shapes.memory_bytes(net, bytes_per_elem)  # weights, gradients, kept inputs
    if state:
        total += state * sum(di * do * la.kernel for di, do, la in zip(shapes.d_in, shapes.d_out, net.layers))
    return total


def penalty(lv_ins, lv_ws, bytes_per_elem: float, state: float) -> np.ndarray:
    """[layer, type] bytes left replicated on both halves by a split (see the module doc)."""
    ins, ws = np.asarray(lv_ins), np.asarray(lv_ws)
    zero = np.zeros_like(ins)
    return np.stack([(2.0 * bytes_per_elem + state) * ws, zero, bytes_per_elem * ins], axis=1)


@dataclass(frozen=True)
class Worst:
    """The device of a plan with the least room: its kind, bytes needed, capacity (over = need - capacity)."""

    kind: str
    need: float
    capacity: float

    @property
    def over(self) -> float:
        return self.need - self.capacity


class NoFit(UsageError):
    """Even the plan that splits every tensor does not fit a device's memory."""


def fit(run, unit: float, fits, steps: int = 8):
    """Smallest penalty weight whose plan fits; returns ``(plan, lam)``.

    ``run(lam)`` plans with penalty weight ``lam`` (``None``: split everything),
    ``fits(plan)`` checks a plan, ``unit`` is a natural scale of ``lam``
    (objective per byte). First the split-everything plan: if it does not fit,
    it is returned (nothing fits). Then ``lam = unit * 16^k`` upwards, then a
    bisection (in log space) between the last plan that did not fit and the
    first that did; the fitting plan with the lowest ``objective`` wins.
    """
    last = run(None)
    if not fits(last):
        return last, None
    found, lo, hi = [], None, None
    for k in range(-3, 12):
        lam = unit * 16.0**k
        p = run(lam)
        if fits(p):
            found.append((p.objective, lam, p))
            hi = lam
            break
        lo = lam
    if hi is None:
        return last, float("inf")
    if lo is not None:
        for _ in range(steps):
            mid = (lo * hi) ** 0.5
            p = run(mid)
            if fits(p):
                found.append((p.objective, mid, p))
                hi = mid
            else:
                lo = mid
    _, lam, p = min(found, key=lambda f: (f[0], f[1]))
    return p, lam


def shortfall_message(net_name: str, batch: int, devices: str, worst: Worst, optimizer: str,
                      bytes_per_elem: float) -> str:
    return (f"{net_name} at batch {batch} does not fit on {devices}: even with every tensor split, a "
            f"{worst.kind} needs {worst.need / GIB:.2f} GiB (weights, gradients, {optimizer} state and kept "
            f"activations at {bytes_per_elem:g} bytes/element) and has {worst.capacity / GIB:.2f} GiB, "
            f"short by {worst.over / GIB:.2f} GiB; use more or larger devices, a smaller batch, "
            "or a lighter --optimizer")
