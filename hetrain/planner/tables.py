"""Per-level cost tables for the DP (numpy), computed once per level cost and reused across solves.

A :class:`Tables` holds the objective-only per-element matrices of one
:class:`~hetrain.planner.cost.LevelCost` and memoises the tables of residual
forks, joins and branches by their sizes. Every entry is computed with the
same floating-point operations, in the same order, as the scalar functions of
:mod:`hetrain.planner.cost` (``forward_fanout``, ``backward_accumulate``,
``intra``), only vectorised: the DP's decisions, ties included, do not depend
on whether a table came from here or from the scalar code
(``tests/planner/test_tables.py`` checks it entry by entry).

A :class:`TableCache` maps level costs to their tables; one cache serves a whole
planning call (all levels, all ratio trials, all baselines), so the tables of a
level cost that reappears (every equal split at one depth) are built once.
"""

from __future__ import annotations

import numpy as np

from hetrain.planner.cost import NEED, NONE, OUT, F, LevelCost

NSTATE = 12  # f * 4 + e
_T = np.arange(3)
_S_F, _S_E = np.arange(NSTATE) // 4, np.arange(NSTATE) % 4


class Tables:
    """Objective-per-element tables of one level cost; fork/join/branch tables memoised by size."""

    def __init__(self, lc: LevelCost):
        self.lc = lc
        rel = np.array([[c[0] for c in row] for row in lc.rel])  # [src, dst], objective per element
        self.rel = rel
        # a single edge from state s = f*4+e to a consumer of type t: forward f -> NEED[t], backward NEED[t] -> e
        self.edge = np.array([[rel[s // 4, NEED[t]] + rel[NEED[t], s % 4] for t in range(3)]
                              for s in range(NSTATE)])
        # type -> type inside a branch: [prev type, next type]
        self.pair = np.array([[rel[OUT[a], NEED[b]] + rel[NEED[b], OUT[a]] for b in range(3)] for a in range(3)])
        self.pair_list = self.pair.tolist()
        fw = np.array([[rel[OUT[t], m] for m in range(3)] for t in range(3)])   # [t, m]
        bw = np.array([[rel[m2, OUT[t]] for m2 in range(3)] for t in range(3)])  # [t, m']
        self.one = fw[:, :, None] + bw[:, None, :]                              # [t, m, m']
        self.two = self.one[:, None] + self.one[None, :]                        # [ta, tb, m, m']
        self.both = lc.both[0]
        self._forks: dict = {}
        self._gathers: dict = {}
        self._joins: dict = {}
        self.branches: dict = {}

    def intra(self, ins, outs, ws, firsts, allowed_mask) -> np.ndarray:
        """[layer, type] objective of each layer's intra-layer reduction (inf where a type is not allowed)."""
        n = np.stack([ws, outs, np.where(firsts, 0.0, ins)], axis=1)
        return np.where(allowed_mask, self.both * n, np.inf)

    def join(self, size: float):
        """Join costs shaped for the DP's block tensors: (identity [1, 1, aL, m, m'],
        two branches [1, 1, 1, aL, bL, m, m'])."""
        got = self._joins.get(size)
        if got is None:
            got = self._joins[size] = ((size * self.one)[None, None], (size * self.two)[None, None, None])
        return got

    def fork(self, size_a: float, other: str, size_b: float) -> np.ndarray:
        """Fork cost shaped for the DP's block tensors: [state, a0, b0, 1, 1, 1, 1] when b is a layer,
        [state, a0, 1, m, m'] when b is the identity."""
        key = (other, size_a, size_b)
        got = self._forks.get(key)
        if got is None:
            table = self.fork_table(size_a, other, size_b)
            got = table[:, :, :, None, None, None, None] if other == "layer" else \
                table.reshape(NSTATE, 3, 3, 3)[:, :, None, :, :]
            self._forks[key] = got
        return got

    def fork_table(self, size_a: float, other: str, size_b: float) -> np.ndarray:
        """Fork cost [state, first type of a, b-choice]: b-choice is b's first type, or m*3+m' for identity."""
        return self._fork(size_a, other, size_b)

    def _fork(self, n1: float, other: str, n2: float) -> np.ndarray:
        g = self._gathers.get(other)
        if g is None:
            g = self._gathers[other] = self._gather(other)
        a, b, via_rel, same_f, base_rel, la_rel, lb_rel, same_b = g
        big = max(n1, n2)
        # forward fan-out from f: direct conversion per distinct layout, or one full copy
        direct = a * n1 + b * n2                                  # [f, a0, bc]
        via = via_rel * big
        fw = np.where(same_f, a * big, np.where(via < direct, via, direct))
        # backward accumulation into e via the best accumulation layout m
        base = base_rel * big                                     # [m, e, 1, 1]
        totals = np.where(same_b, base + la_rel * big, (base + la_rel * n1) + lb_rel * n2)  # [m, e, a0, bc]
        bw = totals.min(axis=0)
        bw[NONE] = 0.0
        return fw[_S_F] + bw[_S_E]

    def _gather(self, other: str):
        """The per-element objective entries a fork table reads, gathered once per level cost."""
        rel = self.rel
        if other == "layer":
            fl = bl = np.broadcast_to(_T[None, :], (3, 3))        # [a0, b0]
        else:
            bc = np.arange(9)
            fl, bl = np.broadcast_to(bc[None, :] // 3, (3, 9)), np.broadcast_to(bc[None, :] % 3, (3, 9))
        la = np.broadcast_to(_T[:, None], fl.shape)              # NEED[a0] = a0
        return (rel[:3, la], rel[:3, fl], rel[:3, F][:, None, None], (la == fl)[None],
                rel[:3, :, None, None], np.stack([rel[la, m] for m in range(3)])[:, None],
                np.stack([rel[bl, m] for m in range(3)])[:, None], (la == bl)[None, None])


class TableCache:
    """Tables by level cost (alpha, bytes per element, bandwidths, objective); bounded, oldest dropped first."""

    def __init__(self, max_entries: int = 256):
        self._tables: dict = {}
        self.max_entries = max_entries

    def get(self, lc: LevelCost) -> Tables:
        key = (lc.alpha, lc.bytes_per_elem, lc.left_bytes_per_s, lc.right_bytes_per_s, lc.objective)
        got = self._tables.get(key)
        if got is None:
            if len(self._tables) >= self.max_entries:
                self._tables.pop(next(iter(self._tables)))
            got = self._tables[key] = Tables(lc)
        return got
