"""Choosing each layer's type at one level: dynamic programming, and brute force as its reference.

The state carried along the network is the boundary tensor's *interface*:
the layout its forward value is available in and the layout its error must
be delivered in, ``(f, e)`` with f in {R, C, F} and e in {R, C, F, NONE}.
A layer of type t leaves ``(OUT[t], OUT[t])``; a join chooses its own
``(m, m')`` (the layout it adds in, and the layout it accumulates the
incoming error in); the network input is ``(F, NONE)``.

Every tensor is costed by exactly one segment (the one reading it), so the
DP optimum equals :func:`~hetrain.planner.evaluate.evaluate` of the
assignment it returns, and the search is exact for residual blocks: a block's
fork, both branches and the join are minimised jointly over all their types
(numpy broadcasting). Cost tables come from :mod:`hetrain.planner.tables`;
pass one :class:`~hetrain.planner.tables.TableCache` to many solves to reuse them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from hetrain.planner.cost import NONE, OUT, F, LevelCost
from hetrain.planner.evaluate import evaluate, evaluate_reference, net_index
from hetrain.planner.layers import Block, Chain, Net
from hetrain.planner.shapes import Shapes
from hetrain.planner.tables import NSTATE, TableCache, Tables

INPUT_STATE = F * 4 + NONE
_CHAIN_STATES = np.array([OUT[t] * 4 + OUT[t] for t in range(3)])
_JOIN_STATES = np.array([m * 4 + m2 for m in range(3) for m2 in range(3)])
_TYPE_OF_OUT = {OUT[t]: t for t in range(3)}
_INF = np.full(NSTATE, np.inf)
_A3, _A9 = np.arange(3), np.arange(9)

__all__ = ["Assignment", "evaluate", "evaluate_reference", "exhaustive", "solve", "per_layer"]


@dataclass(frozen=True)
class Assignment:
    """Types per layer (0, 1, 2 = I, II, III) and ``(m, m')`` per join, at one level."""

    types: tuple[int, ...]
    joins: tuple[tuple[int, int], ...] = ()


def exhaustive(net: Net, shapes: Shapes, lc: LevelCost, allowed=(0, 1, 2)):
    """Reference search: evaluate every type sequence (and join layouts); returns (assignment, objective)."""
    best = None
    memo: dict = {}
    join_opts = list(itertools.product((0, 1, 2), repeat=2))
    for types in itertools.product(*per_layer(allowed, len(net.layers))):
        for joins in itertools.product(join_opts, repeat=net.num_adds):
            asg = Assignment(types, joins)
            obj = evaluate_reference(net, shapes, lc, asg, memo)[0]
            if best is None or obj < best[1] - 1e-12 * abs(obj):
                best = (asg, obj)
    return best


def per_layer(allowed, n: int) -> list[tuple[int, ...]]:
    """``allowed`` is one tuple of types for all layers, or a list with one tuple per layer."""
    if allowed and isinstance(allowed[0], int):
        return [tuple(allowed)] * n
    return [tuple(a) for a in allowed]


def allowed_mask(allowed, n: int) -> np.ndarray:
    """[layer, type] booleans of the allowed types."""
    mask = np.zeros((n, 3), dtype=bool)
    for i, types in enumerate(per_layer(allowed, n)):
        mask[i, list(types)] = True
    return mask


def fixed_types(mask: np.ndarray) -> tuple[int, ...] | None:
    """The types when the mask allows one type per layer (a fixed-type baseline), else None."""
    if not (mask.sum(axis=1) == 1).all():
        return None
    return tuple(int(t) for t in mask.argmax(axis=1))


def fixed_assignment(net: Net, mask: np.ndarray) -> Assignment | None:
    """The DP's answer when there is nothing to search, else None.

    One allowed type per layer and no joins: those types. Type I everywhere
    (data parallelism), with joins: every tensor is held as R rows and the joins
    add in R with their error in R, the only choice that moves nothing (any other
    layout makes some half receive part of a tensor), so it is the DP's unique optimum.
    """
    types = fixed_types(mask)
    if types is None:
        return None
    if net.num_adds == 0:
        return Assignment(types, ())
    if all(t == 0 for t in types):
        return Assignment(types, ((0, 0),) * net.num_adds)
    return None


class Level:
    """One level's sizes and tables, as the DP reads them."""

    def __init__(self, net: Net, shapes: Shapes, tables: Tables, mask: np.ndarray, extra=None):
        idx = net_index(net)
        b, di, do = shapes.arrays()
        ins, outs, ws = b * di * idx.hw_in, b * do * idx.hw_out, di * do * idx.kernel
        self.tb = tables
        self.intra = tables.intra(ins, outs, ws, idx.first_mask, mask)
        if extra is not None:  # a per-layer, per-type penalty (memory pressure), added after the reduction
            self.intra = self.intra + extra
        self.ins, self.outs = ins.tolist(), outs.tolist()
        self._keys = list(zip(self.ins, map(tuple, self.intra.tolist())))

    def branch(self, layers):
        """Best cost of a branch's layers: ``Branch`` (cost [first type, last type] and back pointers)."""
        key = tuple([self._keys[li] for li in layers])
        got = self.tb.branches.get(key)
        if got is None:  # blocks of one stage share their sizes
            got = self.tb.branches[key] = Branch(self.tb.pair_list, [self.ins[li] for li in layers],
                                                 self.intra[list(layers)])
        return got


class Branch:
    """DP along one branch of a block for every first type at once: ``cost[t0, tL]``, paths on demand.

    Plain Python floats: the same additions in the same order as numpy's
    ``vec[:, :, None] + n * pair + row`` and the same first-minimum choice, only
    without numpy's per-call cost on 3x3 arrays.
    """

    __slots__ = ("cost", "back", "as_a", "as_a_only", "as_b")

    def __init__(self, pair, ins, intra):
        inf = float("inf")
        rows = intra.tolist()
        vec = [[rows[0][t] if t == t0 else inf for t in range(3)] for t0 in range(3)]  # [t0, t]
        back = []
        for n, row in zip(ins[1:], rows[1:]):
            npair = [[n * pair[a][b] for b in range(3)] for a in range(3)]
            new_vec, arg = [], []
            for t0 in range(3):
                v0, va, vb = vec[t0]
                col_v, col_a = [], []
                for nxt in range(3):
                    best, at = (v0 + npair[0][nxt]) + row[nxt], 0
                    cand = (va + npair[1][nxt]) + row[nxt]
                    if cand < best:
                        best, at = cand, 1
                    cand = (vb + npair[2][nxt]) + row[nxt]
                    if cand < best:
                        best, at = cand, 2
                    col_v.append(best)
                    col_a.append(at)
                new_vec.append(col_v)
                arg.append(col_a)
            back.append(arg)
            vec = new_vec
        self.back = back
        cost = np.array(vec)
        self.cost = cost
        self.as_a = cost[None, :, None, :, None, None, None]   # [s, a0, b0, aL, bL, m, m']
        self.as_a_only = cost[None, :, :, None, None]          # [s, a0, aL, m, m']
        self.as_b = cost[None, None, :, None, :, None, None]

    def path(self, t0: int, tl: int) -> list[int]:
        path, t = [tl], tl
        for b in reversed(self.back):
            t = b[t0][t]
            path.append(t)
        return path[::-1]


def solve(net: Net, shapes: Shapes, lc: LevelCost, allowed=(0, 1, 2), cache: TableCache | None = None,
          extra=None):
    """Optimal assignment at one level by DP over the segments; returns (assignment, objective).

    ``allowed``: the types to choose from, for all layers, as one tuple per layer, or as an
    :func:`allowed_mask` array.
    ``extra``: optional [layer, type] costs added to each layer's own term (see the memory constraint).
    """
    asg, best, _ = solve_trace(net, shapes, lc, allowed, cache, extra)
    return asg, best


def solve_trace(net, shapes, lc, allowed=(0, 1, 2), cache=None, extra=None):
    """:func:`solve`, plus the forward values after every segment (for look-ahead alternatives)."""
    tables = (cache or TableCache()).get(lc)
    mask = allowed if isinstance(allowed, np.ndarray) else allowed_mask(allowed, len(net.layers))
    lv = Level(net, shapes, tables, mask, extra)
    value = np.full(NSTATE, np.inf)
    value[INPUT_STATE] = 0.0
    trail, values = [], []
    for seg in net.segments:
        if isinstance(seg, Chain):
            li = seg.layer
            tot = value[:, None] + lv.ins[li] * tables.edge + lv.intra[li][None, :]  # [s, t]
            arg = tot.argmin(axis=0)
            new = _INF.copy()
            new[_CHAIN_STATES] = tot[arg, _A3]
            trail.append((seg, arg))
        else:
            new, back = _block(lv, seg, value)
            trail.append((seg, back))
        values.append(new)
        value = new
    state = int(value.argmin())
    best = float(value[state])
    return backtrack(net, trail, state), best, (lv, trail, values)


def backtrack(net: Net, trail, state: int, upto: int | None = None, types=None, joins=None) -> Assignment:
    """The assignment that reaches ``state`` after segment ``upto`` (default: the last), walking back pointers."""
    types = [0] * len(net.layers) if types is None else types
    joins = [(0, 0)] * net.num_adds if joins is None else joins
    end = len(trail) if upto is None else upto + 1
    for seg, back in reversed(trail[:end]):
        if isinstance(seg, Chain):
            t = _TYPE_OF_OUT[state // 4]
            state, types[seg.layer] = int(back[t]), t
        else:
            state, path_a, path_b, mm = _block_back(back, state)
            for li, t in zip(seg.a + seg.b, path_a + path_b):
                types[li] = t
            joins[seg.add] = mm
    return Assignment(tuple(types), tuple(joins))


def block_parts(lv: Level, seg: Block):
    """(fork, branch a, branch b or None, join) of a block, shaped for broadcasting (see :func:`_block`)."""
    tb = lv.tb
    size_add = lv.outs[seg.a[-1]]
    br_a = lv.branch(seg.a)
    if seg.b:
        return (tb.fork(lv.ins[seg.a[0]], "layer", lv.ins[seg.b[0]]), br_a, lv.branch(seg.b),
                tb.join(size_add)[1])
    return tb.fork(lv.ins[seg.a[0]], "identity", size_add), br_a, None, tb.join(size_add)[0]


def _block(lv: Level, seg: Block, value: np.ndarray):
    fork, br_a, br_b, join = block_parts(lv, seg)
    if br_b is not None:  # [s, a0, b0, aL, bL, m, m']
        tot = value[:, None, None, None, None, None, None] + fork + br_a.as_a + br_b.as_b + join
    else:  # [s, a0, aL, m, m']
        tot = value[:, None, None, None, None] + fork + br_a.as_a_only + join
    flat = tot.reshape(-1, 9)
    ks = flat.argmin(axis=0)
    new = _INF.copy()
    new[_JOIN_STATES] = flat[ks, _A9]
    return new, (ks, tot.shape[:-2], br_a, br_b)


def _block_back(back, state: int):
    ks, shape, br_a, br_b = back
    m, m2 = state // 4, state % 4
    k = int(ks[m * 3 + m2])
    index = []
    for dim in reversed(shape[1:]):  # unravel k over (s, a0, [b0,] aL, [bL]) in C order
        k, r = divmod(k, dim)
        index.append(r)
    index.append(k)
    s, path_a, path_b = block_choice(br_a, br_b, index[::-1])
    return s, path_a, path_b, (m, m2)


def block_choice(br_a, br_b, index):
    """(entry state, types of branch a, types of branch b) from an index (s, a0, [b0,] aL, [bL])."""
    if br_b is not None:
        s, a0, b0, al, bl = (int(i) for i in index[:5])
        return s, br_a.path(a0, al), br_b.path(b0, bl)
    s, a0, al = (int(i) for i in index[:3])
    return s, br_a.path(a0, al), []
