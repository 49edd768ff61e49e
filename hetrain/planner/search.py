"""Choosing each layer's type at one level: dynamic programming, an exact evaluator and brute force.

The state carried along the network is the boundary tensor's *interface*:
the layout its forward value is available in and the layout its error must
be delivered in, ``(f, e)`` with f in {R, C, F} and e in {R, C, F, NONE}.
A layer of type t leaves ``(OUT[t], OUT[t])``; a join chooses its own
``(m, m')`` (the layout it adds in, and the layout it accumulates the
incoming error in); the network input is ``(F, NONE)``.

Every tensor is costed by exactly one segment (the one reading it), so the
DP optimum equals :func:`evaluate` of the assignment it returns, and the
search is exact for residual blocks: a block's fork, both branches and the
join are minimised jointly over all their types (numpy broadcasting).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from hetrain.planner.cost import (
    NEED,
    NONE,
    OUT,
    ZERO,
    F,
    LevelCost,
    add3,
    backward_accumulate,
    forward_fanout,
    intra,
)
from hetrain.planner.layers import INPUT, Block, Chain, Net
from hetrain.planner.shapes import Shapes

NSTATE = 12  # f * 4 + e
INPUT_STATE = F * 4 + NONE


@dataclass(frozen=True)
class Assignment:
    """Types per layer (0, 1, 2 = I, II, III) and ``(m, m')`` per join, at one level."""

    types: tuple[int, ...]
    joins: tuple[tuple[int, int], ...] = ()


def evaluate(net: Net, shapes: Shapes, lc: LevelCost, asg: Assignment, memo: dict | None = None):
    """(objective, seconds, bytes) of an assignment at one level, tensor by tensor.

    ``memo`` (optional) caches each term by the choices it depends on (for brute force).
    """
    ins, outs, ws = shapes.sizes(net)
    memo = {} if memo is None else memo
    if "consumers" not in memo:
        consumers: dict[int, list[int]] = {}
        for nid, node in enumerate(net.nodes):
            for p in node.producers:
                consumers.setdefault(p, []).append(nid)
        memo["consumers"] = consumers
        memo["firsts"] = {n.index for n in net.nodes if n.kind == "layer" and n.producers == (INPUT,)}
        memo["join_size"] = [outs[net.add_source(a)] for a in range(net.num_adds)]

    def choice(nid):
        if nid == INPUT:
            return None
        node = net.nodes[nid]
        return asg.types[node.index] if node.kind == "layer" else asg.joins[node.index]

    total = ZERO
    for li, t in enumerate(asg.types):
        key = ("intra", li, t)
        if key not in memo:
            memo[key] = intra(lc, t, ws[li], outs[li], ins[li], li in memo["firsts"])
        total = add3(total, memo[key])
    for prod, cons in memo["consumers"].items():
        key = (prod, choice(prod), tuple(choice(c) for c in cons))
        if key not in memo:
            memo[key] = _tensor(net, lc, asg, prod, cons, ins, memo["join_size"])
        total = add3(total, memo[key])
    return total


def _tensor(net, lc, asg, prod, cons, ins, join_size):
    """Forward fan-out plus backward accumulation of the tensor that node ``prod`` produces."""
    if prod == INPUT:
        src, need = F, NONE
    else:
        node = net.nodes[prod]
        src, need = (OUT[asg.types[node.index]],) * 2 if node.kind == "layer" else asg.joins[node.index]
    fwd, bwd = [], []
    for c in cons:
        node = net.nodes[c]
        if node.kind == "layer":
            lay = NEED[asg.types[node.index]]
            fwd.append((lay, ins[node.index]))
            bwd.append((lay, ins[node.index]))
        else:
            m, m2 = asg.joins[node.index]
            fwd.append((m, join_size[node.index]))
            bwd.append((m2, join_size[node.index]))
    return add3(forward_fanout(lc, src, fwd), backward_accumulate(lc, bwd, need))


def exhaustive(net: Net, shapes: Shapes, lc: LevelCost, allowed=(0, 1, 2)):
    """Reference search: evaluate every type sequence (and join layouts); returns (assignment, objective)."""
    best = None
    memo: dict = {}
    join_opts = list(itertools.product((0, 1, 2), repeat=2))
    for types in itertools.product(*_per_layer(allowed, len(net.layers))):
        for joins in itertools.product(join_opts, repeat=net.num_adds):
            asg = Assignment(types, joins)
            obj = evaluate(net, shapes, lc, asg, memo)[0]
            if best is None or obj < best[1] - 1e-12 * abs(obj):
                best = (asg, obj)
    return best


def _per_layer(allowed, n: int) -> list[tuple[int, ...]]:
    """``allowed`` is one tuple of types for all layers, or a list with one tuple per layer."""
    if allowed and isinstance(allowed[0], int):
        return [tuple(allowed)] * n
    return [tuple(a) for a in allowed]


class _Level:
    """Objective-only cost tables of one level (numpy), shared by the DP's segments."""

    def __init__(self, net: Net, shapes: Shapes, lc: LevelCost, allowed):
        self.lc, self.net = lc, net
        self._forks: dict = {}
        self.ins, self.outs, self.ws = shapes.sizes(net)
        rel = np.array([[c[0] for c in row] for row in lc.rel])  # [src, dst]
        self.rel = rel
        # per-element cost of a single edge from state s to a consumer of type t
        self.edge = np.array([[rel[s // 4, NEED[t]] + rel[NEED[t], s % 4] for t in range(3)]
                              for s in range(NSTATE)])
        allowed = _per_layer(allowed, len(net.layers))
        firsts = {n.index for n in net.nodes if n.kind == "layer" and n.producers == (INPUT,)}
        self.intra = [np.array([intra(lc, t, self.ws[i], self.outs[i], self.ins[i], i in firsts)[0]
                                if t in allowed[i] else np.inf for t in range(3)]) for i in range(len(net.layers))]
        # type -> type transition per element inside a branch: [prev type, next type]
        self.pair = np.array([[rel[OUT[a], NEED[b]] + rel[NEED[b], OUT[a]] for b in range(3)] for a in range(3)])

    def branch(self, layers):
        """Best cost of a branch's layers as [first type, last type], with the type paths."""
        key = tuple((self.ins[li], tuple(self.intra[li])) for li in layers)
        if key not in self._forks:  # blocks of one stage share their sizes
            self._forks[key] = self._branch(layers)
        return self._forks[key]

    def _branch(self, layers):
        cost = np.full((3, 3), np.inf)
        paths = {}
        for t0 in range(3):
            vec = np.full(3, np.inf)
            vec[t0] = self.intra[layers[0]][t0]
            back = []
            for li in layers[1:]:
                tot = vec[:, None] + self.ins[li] * self.pair + self.intra[li][None, :]
                back.append(tot.argmin(axis=0))
                vec = tot.min(axis=0)
            for tl in range(3):
                path, t = [tl], tl
                for b in reversed(back):
                    t = int(b[t])
                    path.append(t)
                cost[t0, tl] = vec[tl]
                paths[t0, tl] = path[::-1]
        return cost, paths

    def fork(self, size_a: float, other: str, size_b: float):
        """Fork cost [state, first type of a, b-choice]; b-choice is a type, or (m, m') flattened for identity."""
        key = (other, size_a, size_b)
        if key not in self._forks:  # blocks of one stage share their sizes
            self._forks[key] = self._fork(size_a, other, size_b)
        return self._forks[key]

    def _fork(self, size_a: float, other: str, size_b: float):
        lc = self.lc
        nb = 3 if other == "layer" else 9
        out = np.zeros((NSTATE, 3, nb))
        for a0 in range(3):
            for bc in range(nb):
                fl, bl = (NEED[bc], NEED[bc]) if other == "layer" else (bc // 3, bc % 3)
                fw = [forward_fanout(lc, f, [(NEED[a0], size_a), (fl, size_b)])[0] for f in range(3)]
                bw = [backward_accumulate(lc, [(NEED[a0], size_a), (bl, size_b)], e)[0] for e in range(4)]
                for s in range(NSTATE):
                    out[s, a0, bc] = fw[s // 4] + bw[s % 4]
        return out

    def join(self, size: float):
        """Join cost [last type of a, last type of b, m, m'] (b = identity handled by the fork)."""
        rel = self.rel
        fw = np.array([[rel[OUT[t], m] for m in range(3)] for t in range(3)])   # [t, m]
        bw = np.array([[rel[m2, OUT[t]] for m2 in range(3)] for t in range(3)])  # [t, m']
        one = fw[:, :, None] + bw[:, None, :]                                   # [t, m, m']
        return size * one, size * (one[:, None] + one[None, :])


def solve(net: Net, shapes: Shapes, lc: LevelCost, allowed=(0, 1, 2)):
    """Optimal assignment at one level by DP over the segments; returns (assignment, objective).

    ``allowed``: the types to choose from, for all layers or as one tuple per layer.
    """
    lv = _Level(net, shapes, lc, allowed)
    value = np.full(NSTATE, np.inf)
    value[INPUT_STATE] = 0.0
    trail = []
    for seg in net.segments:
        if isinstance(seg, Chain):
            li = seg.layer
            tot = value[:, None] + lv.ins[li] * lv.edge + lv.intra[li][None, :]  # [s, t]
            new = np.full(NSTATE, np.inf)
            back = {}
            for t in range(3):
                s = int(tot[:, t].argmin())
                new[OUT[t] * 4 + OUT[t]] = tot[s, t]
                back[OUT[t] * 4 + OUT[t]] = (s, t)
            trail.append((seg, back))
        else:
            new, back = _block(lv, seg, value)
            trail.append((seg, back))
        value = new
    state = int(value.argmin())
    best = float(value[state])
    types = [0] * len(net.layers)
    joins = [(0, 0)] * net.num_adds
    for seg, back in reversed(trail):
        if isinstance(seg, Chain):
            state, types[seg.layer] = back[state]
        else:
            state, path_a, path_b, mm = back[state]
            for li, t in zip(seg.a + seg.b, path_a + path_b):
                types[li] = t
            joins[seg.add] = mm
    return Assignment(tuple(types), tuple(joins)), best


def _block(lv: _Level, seg: Block, value: np.ndarray):
    size_add = lv.outs[seg.a[-1]]
    cost_a, paths_a = lv.branch(seg.a)
    ja, jab = lv.join(size_add)
    if seg.b:
        cost_b, paths_b = lv.branch(seg.b)
        fork = lv.fork(lv.ins[seg.a[0]], "layer", lv.ins[seg.b[0]])  # [s, a0, b0]
        tot = (value[:, None, None, None, None, None, None] + fork[:, :, :, None, None, None, None]
               + cost_a[None, :, None, :, None, None, None] + cost_b[None, None, :, None, :, None, None]
               + jab[None, None, None, :, :, :, :])  # [s, a0, b0, aL, bL, m, m']
    else:
        fork = lv.fork(lv.ins[seg.a[0]], "identity", size_add).reshape(NSTATE, 3, 3, 3)  # [s, a0, m, m']
        tot = (value[:, None, None, None, None] + fork[:, :, None, :, :]
               + cost_a[None, :, :, None, None] + ja[None, None, :, :, :])  # [s, a0, aL, m, m']
    flat = tot.reshape(-1, 9)
    new = np.full(NSTATE, np.inf)
    back = {}
    for mm in range(9):
        k = int(flat[:, mm].argmin())
        m, m2 = divmod(mm, 3)
        if seg.b:
            s, a0, b0, al, bl = np.unravel_index(k, tot.shape[:5])
            pb = paths_b[int(b0), int(bl)]
        else:
            s, a0, al = np.unravel_index(k, tot.shape[:3])
            pb = []
        new[m * 4 + m2] = flat[k, mm]
        back[m * 4 + m2] = (int(s), paths_a[int(a0), int(al)], pb, (m, m2))
    return new, back
