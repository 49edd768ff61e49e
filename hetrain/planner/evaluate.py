"""The exact cost of an assignment at one level, tensor by tensor: a scalar reference and a fast twin.

:func:`evaluate_reference` walks the network in pure Python with the scalar
functions of :mod:`hetrain.planner.cost`; :func:`evaluate` computes the same
terms vectorised with numpy and adds them in the same order (every layer's
intra-layer reduction, then every tensor in order of its producer), so both
return the same floats to the last bit. The planner uses :func:`evaluate` once
per group for the level's seconds and bytes; brute force uses the reference,
whose ``memo`` caches terms across the assignments it tries.
"""

from __future__ import annotations

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
from hetrain.planner.layers import INPUT, Net
from hetrain.planner.shapes import Shapes


class NetIndex:
    """What the evaluators need of a net, computed once: consumers, first layers, join sources, arrays."""

    def __init__(self, net: Net):
        consumers: dict[int, list[int]] = {}
        for nid, node in enumerate(net.nodes):
            for p in node.producers:
                consumers.setdefault(p, []).append(nid)
        self.consumers = consumers
        self.firsts = {n.index for n in net.nodes if n.kind == "layer" and n.producers == (INPUT,)}
        self.first_mask = np.array([i in self.firsts for i in range(len(net.layers))])
        self.join_source = [net.add_source(a) for a in range(net.num_adds)]
        self.hw_in = np.array([float(la.hw_in) for la in net.layers])
        self.hw_out = np.array([float(la.hw_out) for la in net.layers])
        self.kernel = np.array([float(la.kernel) for la in net.layers])
        # every tensor, in producer order: its producer and its (one or two) consumers, as index arrays
        tensors = list(consumers.items())
        if any(len(c) > 2 for _, c in tensors):
            raise ValueError(f"model {net.name!r}: a tensor with more than two readers")
        nodes = net.nodes
        self.num_tensors = len(tensors)
        self.prod_kind = np.array([0 if p == INPUT else (1 if nodes[p].kind == "layer" else 2) for p, _ in tensors],
                                  dtype=np.int64)  # 0 network input, 1 layer, 2 join
        self.prod_idx = np.array([0 if p == INPUT else nodes[p].index for p, _ in tensors], dtype=np.int64)
        self.two = np.array([len(c) == 2 for _, c in tensors])
        self.cons_layer = [np.array([nodes[c[min(j, len(c) - 1)]].kind == "layer" for _, c in tensors])
                           for j in range(2)]
        self.cons_idx = [np.array([nodes[c[min(j, len(c) - 1)]].index for _, c in tensors], dtype=np.int64)
                         for j in range(2)]


def net_index(net: Net) -> NetIndex:
    idx = net.__dict__.get("_net_index")
    if idx is None:
        idx = net.__dict__["_net_index"] = NetIndex(net)
    return idx


def evaluate_reference(net: Net, shapes: Shapes, lc: LevelCost, asg, memo: dict | None = None):
    """(objective, seconds, bytes) of an assignment at one level, tensor by tensor, in pure Python.

    ``memo`` (optional) caches each term by the choices it depends on (for brute force).
    """
    ins, outs, ws = shapes.sizes(net)
    memo = {} if memo is None else memo
    idx = net_index(net)
    if "join_size" not in memo:
        memo["join_size"] = [outs[s] for s in idx.join_source]

    def choice(nid):
        if nid == INPUT:
            return None
        node = net.nodes[nid]
        return asg.types[node.index] if node.kind == "layer" else asg.joins[node.index]

    total = ZERO
    for li, t in enumerate(asg.types):
        key = ("intra", li, t)
        if key not in memo:
            memo[key] = intra(lc, t, ws[li], outs[li], ins[li], li in idx.firsts)
        total = add3(total, memo[key])
    for prod, cons in idx.consumers.items():
        key = (prod, choice(prod), tuple(choice(c) for c in cons))
        if key not in memo:
            memo[key] = _tensor(net, lc, asg, prod, cons, ins, memo["join_size"])
        total = add3(total, memo[key])
    return total


def _interface(net: Net, asg, prod: int):
    if prod == INPUT:
        return F, NONE
    node = net.nodes[prod]
    return (OUT[asg.types[node.index]],) * 2 if node.kind == "layer" else asg.joins[node.index]


def _tensor(net, lc, asg, prod, cons, ins, join_size):
    """Forward fan-out plus backward accumulation of the tensor that node ``prod`` produces."""
    src, need = _interface(net, asg, prod)
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


def evaluate(net: Net, shapes: Shapes, lc: LevelCost, asg):
    """(objective, seconds, bytes) of an assignment: :func:`evaluate_reference`'s floats, vectorised.

    Same terms, same operations, same order of addition as the reference (a fork's two readers
    are handled as ``forward_fanout`` and ``backward_accumulate`` handle a list of two).
    """
    idx = net_index(net)
    b, di, do = (np.array(v) for v in (shapes.batch, shapes.d_in, shapes.d_out))
    ins, outs, ws = b * di * idx.hw_in, b * do * idx.hw_out, di * do * idx.kernel
    types = np.array(asg.types, dtype=np.int64)
    rel = np.array(lc.rel)                      # [src, dst, metric]
    n_intra = np.where(types == 0, ws, np.where(types == 1, outs, np.where(idx.first_mask, 0.0, ins)))
    terms = np.empty((len(types) + idx.num_tensors, 3))
    terms[:len(types)] = n_intra[:, None] * np.array(lc.both)[None, :]
    joins = np.array(asg.joins if asg.joins else [(0, 0)], dtype=np.int64)
    join_src = np.array(idx.join_source or [0], dtype=np.int64)
    need_of = np.array(NEED)[types]
    kind, pidx = idx.prod_kind, idx.prod_idx
    src = np.where(kind == 0, F, np.where(kind == 1, np.array(OUT)[types[np.where(kind == 1, pidx, 0)]],
                                          joins[np.where(kind == 2, pidx, 0), 0]))
    need = np.where(kind == 0, NONE, np.where(kind == 1, src, joins[np.where(kind == 2, pidx, 0), 1]))
    fl, bl, n = [], [], []
    for j in range(2):  # each reader: the layout it reads in, the layout of its error, elements
        is_layer, cidx = idx.cons_layer[j], idx.cons_idx[j]
        li, ji = np.where(is_layer, cidx, 0), np.where(is_layer, 0, cidx)
        fl.append(np.where(is_layer, need_of[li], joins[ji, 0]))
        bl.append(np.where(is_layer, need_of[li], joins[ji, 1]))
        n.append(np.where(is_layer, ins[li], outs[join_src[ji]])[:, None])
    two = idx.two[:, None]
    # forward fan-out: one layout (or two equal ones): convert the biggest; two: direct or via a full copy
    f_same = (~idx.two) | (fl[0] == fl[1])
    big_f = np.where(f_same[:, None] & idx.two[:, None], np.maximum(n[0], n[1]), n[0])
    direct = rel[src, fl[0]] * n[0] + rel[src, fl[1]] * n[1]
    via = rel[src, F] * np.maximum(n[0], n[1])
    fwd = np.where(f_same[:, None], rel[src, fl[0]] * big_f,
                   np.where((via[:, 0] < direct[:, 0])[:, None], via, direct))
    # backward accumulation: into the best layout m, then to the producer's error layout
    b_same = (~idx.two) | (bl[0] == bl[1])
    big_b = np.where(two, np.maximum(n[0], n[1]), n[0])
    first_b = np.where((b_same & idx.two)[:, None], big_b, n[0])
    totals = []
    for m in range(3):
        one = rel[m, need] * big_b + rel[bl[0], m] * first_b
        totals.append(np.where(b_same[:, None], one, one + rel[bl[1], m] * n[1]))
    totals = np.stack(totals)                   # [m, tensor, metric]
    best = totals[:, :, 0].argmin(axis=0)
    bwd = totals[best, np.arange(idx.num_tensors)]
    bwd[need == NONE] = 0.0
    terms[len(types):] = fwd + bwd
    total = np.cumsum(terms, axis=0)[-1]  # sequential, like the reference's left fold
    return float(total[0]), float(total[1]), float(total[2])
