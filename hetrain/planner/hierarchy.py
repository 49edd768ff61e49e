"""Recursive planning: split the array in halves, choose types at this level, recurse into each half.

``plan(net, batch, devices, config)`` returns a :class:`GroupPlan` tree. Each
level chooses the split ratio (0.5 for equal halves, balanced otherwise), the
layer types (DP of :mod:`hetrain.planner.search`, or a baseline's fixed types),
and the shapes each half sees; halves with the same devices and shapes are
planned once (memoised), so a homogeneous array of 2^k devices costs k DPs.

Step time model: a half's time is its own compute plus its lower levels'
communication; a level adds its own exchange after the slower half,
``step = max(left, right) + level_comm``. Communication volume is summed over
every pair of halves at every level (the whole array's bytes per step).
"""

from __future__ import annotations

from dataclasses import dataclass

from hetrain.planner.cost import LevelCost
from hetrain.planner.devices import Device, describe
from hetrain.planner.evaluate import evaluate
from hetrain.planner.layers import Net
from hetrain.planner.ratio import balance, capacity_ratio
from hetrain.planner.search import Assignment, allowed_mask, solve
from hetrain.planner.shapes import Shapes
from hetrain.planner.tables import TableCache


@dataclass(frozen=True)
class PlanConfig:
    """How to plan: objective ("time" | "volume"), allowed types, bytes per element, ratio policy.

    ``allowed`` is one tuple of types (0, 1, 2 = I, II, III) for every layer, or a
    callable ``net -> list of tuples`` (baselines fix one type per layer).
    ``ratio`` is "balance" (finish together) or "equal" (always 0.5, as HyPar).
    """

    name: str = "plan"
    objective: str = "time"
    allowed: object = (0, 1, 2)
    bytes_per_elem: float = 2.0
    ratio: str = "balance"


@dataclass
class GroupPlan:
    """The plan of one group of devices (a leaf when it holds one device)."""

    devices: str
    num_devices: int
    step_s: float
    compute_s: float
    comm_s: float
    comm_bytes: float
    memory_bytes: float
    depth: int = 0
    alpha: float = 1.0
    assignment: Assignment | None = None
    level_comm_s: float = 0.0
    level_comm_bytes: float = 0.0
    left: GroupPlan | None = None
    right: GroupPlan | None = None
    ratio_trials: int = 0

    def levels(self):
        """Distinct (depth, devices, alpha, assignment) of the internal groups, top-down."""
        seen, out, stack = set(), [], [self]
        while stack:
            g = stack.pop(0)
            if g.assignment is None:
                continue
            key = (g.depth, g.devices, round(g.alpha, 6), g.assignment)
            if key not in seen:
                seen.add(key)
                out.append(g)
            stack.extend([g.left, g.right])
        return out


def plan(net: Net, batch: int, devices: list[Device], config: PlanConfig = PlanConfig()) -> GroupPlan:
    """Plan ``net`` at global batch ``batch`` (samples) on ``devices`` (at least one)."""
    allowed = allowed_mask(config.allowed(net) if callable(config.allowed) else config.allowed, len(net.layers))
    memo: dict = {"tables": TableCache()}
    return _group(net, Shapes.full(net, batch), list(devices), config, allowed, memo, 0)


def _group(net, shapes, devs, cfg, allowed, memo, depth) -> GroupPlan:
    key = (tuple(d.kind for d in devs), shapes, depth)
    if key in memo:
        return memo[key]
    if len(devs) == 1:
        d = devs[0]
        compute = shapes.train_flops(net) / d.flops_per_s
        result = GroupPlan(d.kind, 1, compute, compute, 0.0, 0.0, shapes.memory_bytes(net, cfg.bytes_per_elem),
                           depth)
        memo[key] = result
        return result
    half = (len(devs) + 1) // 2
    left, right = devs[:half], devs[half:]
    bw_l = sum(d.link_bytes_per_s for d in left)
    bw_r = sum(d.link_bytes_per_s for d in right)

    tried: dict[float, tuple] = {}

    def attempt(alpha):
        if alpha not in tried:
            lc = LevelCost(alpha, cfg.bytes_per_elem, bw_l, bw_r, cfg.objective)
            asg, _ = solve(net, shapes, lc, allowed, memo["tables"])
            lp = _group(net, shapes.split(asg.types, alpha), left, cfg, allowed, memo, depth + 1)
            rp = _group(net, shapes.split(asg.types, 1.0 - alpha), right, cfg, allowed, memo, depth + 1)
            tried[alpha] = (lc, asg, lp, rp)
        return tried[alpha]

    trials = 1
    same = [d.kind for d in left] == [d.kind for d in right]
    if same or cfg.ratio == "equal":
        alpha = 0.5
    else:
        guess = capacity_ratio(sum(d.flops_per_s for d in left), sum(d.flops_per_s for d in right))
        alpha, trials = balance(lambda a: _gap(attempt(a)), guess)
    lc, asg, lp, rp = attempt(alpha)
    _, level_s, level_bytes = evaluate(net, shapes, lc, asg)
    slow = lp if lp.step_s >= rp.step_s else rp
    result = GroupPlan(
        devices=describe(devs), num_devices=len(devs), step_s=slow.step_s + level_s,
        compute_s=slow.compute_s, comm_s=slow.comm_s + level_s,
        comm_bytes=lp.comm_bytes + rp.comm_bytes + level_bytes,
        memory_bytes=max(lp.memory_bytes, rp.memory_bytes), depth=depth, alpha=alpha, assignment=asg,
        level_comm_s=level_s, level_comm_bytes=level_bytes, left=lp, right=rp, ratio_trials=trials)
    memo[key] = result
    return result


def _gap(parts) -> float:
    _, _, lp, rp = parts
    return lp.step_s - rp.step_s
