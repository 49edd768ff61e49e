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

Search across levels (``search="lookahead"``): the level-by-level DP is greedy
(a level's types are chosen for that level's cost alone, ties broken
arbitrarily, yet they shape every level below). With look-ahead, each level
takes the DP's ``width`` best alternatives (:mod:`hetrain.planner.alternatives`,
the greedy optimum first), plans the halves below each one, keeps the
alternative with the best total, and re-plans the kept halves the same way.
The greedy choice is always among the alternatives and every half is planned
at least as well as greedily, so the result is never worse than greedy.

Memory (``fit_memory``): plans whose devices overflow are avoided through a
penalty weight searched by :func:`hetrain.planner.memory.fit`; unequal halves
shift their ratio until both fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetrain.planner.alternatives import alternatives
from hetrain.planner.cost import LevelCost
from hetrain.planner.devices import Device, describe
from hetrain.planner.evaluate import evaluate
from hetrain.planner.layers import Net
from hetrain.planner.memory import NoFit, Worst, fit, need_bytes, penalty, shortfall_message
from hetrain.planner.ratio import HI, LO, balance, capacity_ratio
from hetrain.planner.search import Assignment, allowed_mask, fixed_assignment, fixed_types, solve
from hetrain.planner.shapes import Shapes
from hetrain.planner.tables import TableCache

SEARCHES = ("greedy", "lookahead")
_SPLIT_ALL = 1e30  # penalty weight of "split everything" (relative to the objective's unit)


@dataclass(frozen=True)
class PlanConfig:
    """How to plan.

    ``objective`` "time" | "volume"; ``allowed`` one tuple of types (0, 1, 2 = I, II, III)
    for every layer, or a callable ``net -> list of tuples`` (baselines fix one type per layer);
    ``ratio`` "balance" (finish together) or "equal" (always 0.5, as HyPar); ``search``
    "greedy" (level by level) or "lookahead" (``width`` alternatives per level, see the
    module doc); ``state_bytes`` optimizer state per weight element, ``optimizer`` its name;
    ``fit_memory``: keep every device within its memory (else memory is only reported).
    """

    name: str = "plan"
    objective: str = "time"
    allowed: object = (0, 1, 2)
    bytes_per_elem: float = 2.0
    ratio: str = "balance"
    search: str = "greedy"
    width: int = 4
    depth: int = 1
    within: float = float("inf")
    state_bytes: float = 0.0
    optimizer: str = "sgd"
    fit_memory: bool = False


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
    worst: Worst | None = None
    objective: float = 0.0
    penalty_weight: float = 0.0

    @property
    def fits(self) -> bool:
        return self.worst is None or self.worst.over <= 0

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
    """Plan ``net`` at global batch ``batch`` (samples) on ``devices`` (at least one).

    With ``config.fit_memory``, raises :class:`~hetrain.planner.memory.NoFit` (a UsageError)
    when no plan fits every device's memory.
    """
    if config.search not in SEARCHES:
        raise ValueError(f"search must be one of {SEARCHES}, got {config.search!r}")
    planner = _Planner(net, config)
    shapes, devs = Shapes.full(net, batch), list(devices)
    look = config.depth if config.search == "lookahead" else 0
    result = planner.group(shapes, devs, 0, 0.0, look)
    if not config.fit_memory or result.fits:
        return result
    unit = result.objective / max(need_bytes(shapes, net, config.bytes_per_elem, config.state_bytes), 1.0)
    best, lam = fit(lambda lam: planner.group(shapes, devs, 0, _SPLIT_ALL * unit if lam is None else lam, look),
                    unit, lambda p: p.fits)
    if lam is None:
        raise NoFit(shortfall_message(net.name, batch, describe(devs), best.worst, config.optimizer,
                                      config.bytes_per_elem))
    best.penalty_weight = lam
    return best


class _Planner:
    def __init__(self, net: Net, cfg: PlanConfig):
        self.net, self.cfg = net, cfg
        self.allowed = allowed_mask(cfg.allowed(net) if callable(cfg.allowed) else cfg.allowed, len(net.layers))
        self.fixed = fixed_assignment(net, self.allowed)  # fixed-type baselines need no search
        self.fixed_types = fixed_types(self.allowed)  # fixed types whose joins are searched: a cheaper first ratio
        self.memo: dict = {}
        self.solved: dict = {}
        self.templates: dict = {}
        self.tables = TableCache()

    def _key(self, p: GroupPlan):
        """Which of two plans of the same group is better: fitting first, then the objective."""
        return (max(p.worst.over, 0.0) if (self.cfg.fit_memory and p.worst) else 0.0, p.objective)

    def group(self, shapes: Shapes, devs: list[Device], depth: int, lam: float, look: int) -> GroupPlan:
        key = (tuple([d.kind for d in devs]), shapes, depth, lam, look)
        got = self.memo.get(key)
        if got is None:
            got = self.memo[key] = self._leaf(shapes, devs[0], depth) if len(devs) == 1 else \
                self._split(shapes, devs, depth, lam, look)
        return got

    def _leaf(self, shapes: Shapes, d: Device, depth: int) -> GroupPlan:
        net, cfg = self.net, self.cfg
        compute = shapes.train_flops(net) / d.flops_per_s
        need = need_bytes(shapes, net, cfg.bytes_per_elem, cfg.state_bytes)
        return GroupPlan(d.kind, 1, compute, compute, 0.0, 0.0, need, depth,
                         worst=Worst(d.kind, need, d.memory_bytes), objective=compute if cfg.objective == "time" else 0.0)

    def _split(self, shapes: Shapes, devs: list[Device], depth: int, lam: float, look: int) -> GroupPlan:
        net, cfg = self.net, self.cfg
        half = (len(devs) + 1) // 2
        left, right = devs[:half], devs[half:]
        bw_l = sum(d.link_bytes_per_s for d in left)
        bw_r = sum(d.link_bytes_per_s for d in right)
        extra = None
        if lam:
            ins, _, ws = shapes.sizes(net)
            extra = lam * penalty(ins, ws, cfg.bytes_per_elem, cfg.state_bytes)
        tried: dict[float, tuple] = {}

        def halves(asg, alpha, sub_look):
            return (self.group(shapes.split(asg.types, alpha), left, depth + 1, lam, sub_look),
                    self.group(shapes.split(asg.types, 1.0 - alpha), right, depth + 1, lam, sub_look))

        def attempt(alpha):  # the greedy plan of this group at ratio alpha
            if alpha not in tried:
                lc = LevelCost(alpha, cfg.bytes_per_elem, bw_l, bw_r, cfg.objective)
                # bytes do not depend on bandwidths: equal shapes on other devices make the same choice
                key = (shapes, alpha, lam) + (() if cfg.objective == "volume" else (bw_l, bw_r))
                asg = self.fixed if not lam else None
                asg = asg or self.solved.get(key)
                if asg is None:
                    asg = self.solved[key] = solve(net, shapes, lc, self.allowed, self.tables, extra)[0]
                tried[alpha] = (lc, asg, *halves(asg, alpha, 0))
            return tried[alpha]

        trials = 1
        same = [d.kind for d in left] == [d.kind for d in right]
        if same or cfg.ratio == "equal":
            alpha = 0.5
        else:
            guess = capacity_ratio(sum(d.flops_per_s for d in left), sum(d.flops_per_s for d in right))
            if self.fixed is None and self.fixed_types is not None:
                guess = self._fixed_types_guess(shapes, left, right, guess)
            alpha, trials = balance(lambda a: _gap(attempt(a)), guess,
                                    slope=lambda a, gap: self._slope(shapes, left, right, attempt(a), gap))
            if cfg.fit_memory:
                alpha = _fit_ratio(alpha, attempt)
                trials = len(tried)
        if look == 0:
            lc, asg, lp, rp = attempt(alpha)
            return self._combine(shapes, devs, depth, alpha, lc, asg, lp, rp, trials, lam)
        lc = LevelCost(alpha, cfg.bytes_per_elem, bw_l, bw_r, cfg.objective)
        best = None
        for asg, _ in alternatives(net, shapes, lc, self.allowed, self.tables, extra, cfg.width, cfg.within):
            lp, rp = halves(asg, alpha, look - 1)
            cand = self._combine(shapes, devs, depth, alpha, lc, asg, lp, rp, trials, lam)
            if best is None or self._key(cand) < self._key(best):
                best = cand
        # re-plan the kept alternative's halves with look-ahead too; keep each half's better plan
        lp, rp = halves(best.assignment, alpha, look)
        lp = lp if self._key(lp) < self._key(best.left) else best.left
        rp = rp if self._key(rp) < self._key(best.right) else best.right
        if lp is best.left and rp is best.right:
            return best
        return self._combine(shapes, devs, depth, alpha, lc, best.assignment, lp, rp, trials, lam)

    def _fixed_types_guess(self, shapes: Shapes, left, right, guess: float, h: float = 1e-4) -> float:
        """A first ratio for fixed types whose joins the DP chooses (one weird trick): one Newton step
        on the re-costed gap of those types with every join adding rows (R, R), no DP. It saves the
        trial at the compute-only guess, most of all when the answer is an end of (0, 1)."""
        asg = Assignment(self.fixed_types, ((0, 0),) * self.net.num_adds)
        trees, memo = (self._template(left, asg), self._template(right, asg)), {}

        def gap(a):
            return (self._replay(trees[0], shapes.split(asg.types, a), left, memo)
                    - self._replay(trees[1], shapes.split(asg.types, 1.0 - a), right, memo))

        at = gap(guess)
        step = -h if guess + h > HI else h
        slope = (gap(guess + step) - at) / step
        if not slope > 0:
            return guess
        return min(max(guess - at / slope, LO), HI)

    def _template(self, devs: list[Device], asg: Assignment) -> GroupPlan:
        """A plan tree with ``asg`` at every level and compute-only ratios, to re-cost (no DP)."""
        kinds = tuple([d.kind for d in devs])
        got = self.templates.get((kinds, asg))
        if got is None:
            got = GroupPlan(describe(devs), len(devs), 0.0, 0.0, 0.0, 0.0, 0.0)
            if len(devs) > 1:
                half = (len(devs) + 1) // 2
                left, right = devs[:half], devs[half:]
                same = [d.kind for d in left] == [d.kind for d in right]
                got.assignment = asg
                got.alpha = 0.5 if same or self.cfg.ratio == "equal" else capacity_ratio(
                    sum(d.flops_per_s for d in left), sum(d.flops_per_s for d in right))
                got.left, got.right = self._template(left, asg), self._template(right, asg)
            self.templates[(kinds, asg)] = got
        return got

    def _slope(self, shapes: Shapes, left, right, tried, gap: float, h: float = 1e-4) -> float:
        """d gap / d alpha of a tried ratio's plan, every level's types held (re-costed, no DP)."""
        lc, asg, lp, rp = tried
        step = -h if gap > 0 else h
        if not LO <= lc.alpha + step <= HI:
            step = -step
        at, memo = lc.alpha + step, {}
        moved = (self._replay(lp, shapes.split(asg.types, at), left, memo)
                 - self._replay(rp, shapes.split(asg.types, 1.0 - at), right, memo))
        return (moved - gap) / step

    def _replay(self, g: GroupPlan, shapes: Shapes, devs: list[Device], memo: dict) -> float:
        """Step time of ``g``'s partitioning (its types, joins and ratios at every level) on ``shapes``."""
        if g.assignment is None:
            return shapes.train_flops(self.net) / devs[0].flops_per_s
        key = (id(g), shapes)
        got = memo.get(key)
        if got is None:
            half = (len(devs) + 1) // 2
            left, right = devs[:half], devs[half:]
            lc = LevelCost(g.alpha, self.cfg.bytes_per_elem, sum(d.link_bytes_per_s for d in left),
                           sum(d.link_bytes_per_s for d in right), self.cfg.objective)
            types = g.assignment.types
            slow = max(self._replay(g.left, shapes.split(types, g.alpha), left, memo),
                       self._replay(g.right, shapes.split(types, 1.0 - g.alpha), right, memo))
            got = memo[key] = slow + evaluate(self.net, shapes, lc, g.assignment)[1]
        return got

    def _combine(self, shapes, devs, depth, alpha, lc, asg, lp, rp, trials, lam) -> GroupPlan:
        _, level_s, level_bytes = evaluate(self.net, shapes, lc, asg)
        slow = lp if lp.step_s >= rp.step_s else rp
        worst = max(lp.worst, rp.worst, key=lambda w: w.over)
        step = slow.step_s + level_s
        comm_bytes = lp.comm_bytes + rp.comm_bytes + level_bytes
        return GroupPlan(
            devices=describe(devs), num_devices=len(devs), step_s=step, compute_s=slow.compute_s,
            comm_s=slow.comm_s + level_s, comm_bytes=comm_bytes, memory_bytes=max(lp.memory_bytes, rp.memory_bytes),
            depth=depth, alpha=alpha, assignment=asg, level_comm_s=level_s, level_comm_bytes=level_bytes,
            left=lp, right=rp, ratio_trials=trials, worst=worst,
            objective=step if self.cfg.objective == "time" else comm_bytes, penalty_weight=lam)


def _gap(parts) -> float:
    _, _, lp, rp = parts
    return lp.step_s - rp.step_s


def _fit_ratio(alpha: float, attempt, steps: int = 12) -> float:
    """Move ``alpha`` from the balanced ratio towards the side with room until both halves fit."""
    _, _, lp, rp = attempt(alpha)
    left_over, right_over = lp.worst.over > 0, rp.worst.over > 0
    if left_over == right_over:
        return alpha  # both fit, or neither does (then only more splitting helps)
    end = LO if left_over else HI
    _, _, lp, rp = attempt(end)
    if lp.worst.over > 0 or rp.worst.over > 0:
        return alpha
    bad, good = alpha, end
    for _ in range(steps):  # bisect for the fitting ratio closest to the balanced one
        mid = (bad + good) / 2
        _, _, lp, rp = attempt(mid)
        if lp.worst.over <= 0 and rp.worst.over <= 0:
            good = mid
        else:
            bad = mid
    return good
