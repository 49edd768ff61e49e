"""Near-optimal alternatives at one level: the look-ahead search's candidates.

The DP of :mod:`hetrain.planner.search` finds one optimal assignment; a search
across levels wants a few others that cost (almost) as little at this level but
may leave better shapes below. A backward pass gives, for every segment and
every boundary state, the best cost of the rest of the network; adding the
forward value gives the *min-marginal*: the best total over all assignments
that pass through that state. Forcing each choice in turn (a layer's type; a
residual block's first and last types of each branch and its join layouts)
and ranking by min-marginal yields the alternatives, the optimum first. Ties
at this level appear as alternatives with the optimum's cost.
"""

from __future__ import annotations

import numpy as np

from hetrain.planner.layers import Chain, Net
from hetrain.planner.search import (
    _CHAIN_STATES,
    _JOIN_STATES,
    INPUT_STATE,
    Assignment,
    backtrack,
    block_choice,
    block_parts,
    solve_trace,
)
from hetrain.planner.tables import NSTATE


def alternatives(net: Net, shapes, lc, allowed=(0, 1, 2), cache=None, extra=None, k: int = 4,
                 within: float = float("inf")):
    """Up to ``k`` distinct assignments at one level, ``[(assignment, objective at this level), ...]``,
    the DP's optimum first, then the others by increasing min-marginal, up to ``(1 + within)``
    times the optimum (``within=0``: exact ties only, up to rounding)."""
    best_asg, best, (lv, trail, values) = solve_trace(net, shapes, lc, allowed, cache, extra)
    out = [(best_asg, best)]
    if k <= 1:
        return out
    segs = net.segments
    after, bwd, ptr = np.zeros(NSTATE), [None] * len(segs), [None] * len(segs)
    parts = {}
    for j in reversed(range(len(segs))):  # cost of segments j+1.. from each state after segment j
        bwd[j] = after
        seg = segs[j]
        if isinstance(seg, Chain):
            li = seg.layer
            tot = lv.ins[li] * lv.tb.edge + lv.intra[li][None, :] + after[_CHAIN_STATES][None, :]  # [s, t]
        else:
            parts[j] = _block_tensor(lv, seg, after)
            tot = parts[j].reshape(NSTATE, -1)
        ptr[j] = tot.argmin(axis=1)
        after = tot.min(axis=1)
    candidates = []  # (min-marginal, order, how to build)
    for j, seg in enumerate(segs):
        entry = values[j - 1] if j else _input_vector()
        if isinstance(seg, Chain):  # (choices the optimum already makes are skipped)
            for t in range(3):
                if t != best_asg.types[seg.layer]:
                    x = _CHAIN_STATES[t]
                    candidates.append((values[j][x] + bwd[j][x], len(candidates), ("chain", j, x)))
            continue
        full = entry.reshape((NSTATE,) + (1,) * (parts[j].ndim - 1)) + parts[j]
        parts[j] = (parts[j], full)
        ends = (seg.a[0], seg.b[0], seg.a[-1], seg.b[-1]) if seg.b else (seg.a[0], seg.a[-1])
        for axis, layer in enumerate(ends, start=1):  # first/last types of each branch
            others = tuple(a for a in range(full.ndim) if a != axis)
            for v, cost in enumerate(full.min(axis=others).tolist()):
                if v != best_asg.types[layer]:
                    candidates.append((cost, len(candidates), ("block", j, (axis, v))))
        for x in _JOIN_STATES:  # join layouts
            if (x // 4, x % 4) != best_asg.joins[seg.add]:
                candidates.append((values[j][x] + bwd[j][x], len(candidates), ("exit", j, int(x))))
    seen = {best_asg}
    limit = best * (1.0 + within) + 1e-9 * abs(best)
    for cost, _, how in sorted(candidates):
        if not (cost <= limit and np.isfinite(cost)):
            break
        asg = _build(net, trail, ptr, parts, lv, how)
        if asg not in seen:
            seen.add(asg)
            out.append((asg, float(cost)))
            if len(out) >= k:
                break
    return out


def _input_vector():
    v = np.full(NSTATE, np.inf)
    v[INPUT_STATE] = 0.0
    return v


def _block_tensor(lv, seg, after):
    """A block's cost over [s, a0, (b0,) aL, (bL,) m, m'] plus the cost of what follows its exit state."""
    fork, br_a, br_b, join = block_parts(lv, seg)
    follow = after[_JOIN_STATES].reshape(3, 3)
    if br_b is not None:
        return fork + br_a.as_a + br_b.as_b + join + follow
    return fork + br_a.as_a_only + join + follow


def _build(net, trail, ptr, parts, lv, how) -> Assignment:
    types, joins = [0] * len(net.layers), [(0, 0)] * net.num_adds
    kind, j, what = how
    segs = net.segments
    if kind in ("chain", "exit"):  # the forward pointers reach the state after segment j
        backtrack(net, trail, what, upto=j, types=types, joins=joins)
        state = what
    else:  # a block with its internal choice forced: prefix to its entry state, the block, then the rest
        seg = segs[j]
        axis, v = what
        sub = np.take(parts[j][1], v, axis=axis)
        index = list(np.unravel_index(int(sub.argmin()), sub.shape))
        index.insert(axis, v)
        what = tuple(int(i) for i in index)
        s, path_a, path_b = _set_block(lv, seg, what, types, joins)
        if j:
            backtrack(net, trail, s, upto=j - 1, types=types, joins=joins)
        state = what[-2] * 4 + what[-1]
    for jj in range(j + 1, len(segs)):  # the backward pointers from there on
        seg = segs[jj]
        if isinstance(seg, Chain):
            t = int(ptr[jj][state])
            types[seg.layer] = t
            state = _CHAIN_STATES[t]
        else:
            index = np.unravel_index(int(ptr[jj][state]), parts[jj][0].shape[1:])
            _set_block(lv, seg, (state, *index), types, joins)
            state = int(index[-2]) * 4 + int(index[-1])
    return Assignment(tuple(types), tuple(joins))


def _set_block(lv, seg, index, types, joins):
    br_a = lv.branch(seg.a)
    br_b = lv.branch(seg.b) if seg.b else None
    s, path_a, path_b = block_choice(br_a, br_b, index)
    for li, t in zip(seg.a + seg.b, path_a + path_b):
        types[li] = t
    joins[seg.add] = (int(index[-2]), int(index[-1]))
    return s, path_a, path_b


__all__ = ["alternatives"]
