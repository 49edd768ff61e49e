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
        # each reader as a layer index (0 where it is a join) and as a join index (0 where it is a layer)
        self.reader_layer = [np.where(self.cons_layer[j], self.cons_idx[j], 0) for j in range(2)]
        self.reader_join = [np.where(self.cons_layer[j], 0, self.cons_idx[j]) for j in range(2)]
        join_src = np.array(self.join_source or [0], dtype=np.int64)
        self.reader_join_src = [join_src[self.reader_join[j]] for j in range(2)]
        self.tensor_range = np.arange(self.num_tensors)


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
    What depends on the assignment alone (layouts, readers) is kept per assignment
    (:class:`_Layouts`); a ratio search re-costs the same assignments on other shapes.
    """
    idx = net_index(net)
    lay = _layouts(net, idx, asg)
    b, di, do = shapes.arrays()
    ins, outs, ws = b * di * idx.hw_in, b * do * idx.hw_out, di * do * idx.kernel
    rel = np.array(lc.rel)                      # [src, dst, metric]
    n_intra = np.where(lay.type_i, ws, np.where(lay.type_ii, outs, np.where(idx.first_mask, 0.0, ins)))
    num_layers = len(lay.type_i)
    terms = np.empty((num_layers + idx.num_tensors, 3))
    terms[:num_layers] = n_intra[:, None] * np.array(lc.both)[None, :]
    n = [np.where(idx.cons_layer[j], ins[idx.reader_layer[j]], outs[idx.reader_join_src[j]])[:, None]
         for j in range(2)]
    two = idx.two[:, None]
    # every per-element cost the tensors read, in one gather (see _Layouts.gather)
    src_fl0, src_fl1, src_f, *per_m = rel.reshape(-1, 3)[lay.gather].reshape(12, idx.num_tensors, 3)
    # forward fan-out: one layout (or two equal ones): convert the biggest; two: direct or via a full copy
    big_f = np.where(lay.f_same_two, np.maximum(n[0], n[1]), n[0])
    direct = src_fl0 * n[0] + src_fl1 * n[1]
    via = src_f * np.maximum(n[0], n[1])
    fwd = np.where(lay.f_same, src_fl0 * big_f,
                   np.where((via[:, 0] < direct[:, 0])[:, None], via, direct))
    # backward accumulation: into the best layout m, then to the producer's error layout
    big_b = np.where(two, np.maximum(n[0], n[1]), n[0])
    first_b = np.where(lay.b_same_two, big_b, n[0])
    totals = []
    for m in range(3):
        m_need, bl0_m, bl1_m = per_m[3 * m:3 * m + 3]
        one = m_need * big_b + bl0_m * first_b
        totals.append(np.where(lay.b_same, one, one + bl1_m * n[1]))
    totals = np.stack(totals)                   # [m, tensor, metric]
    best = totals[:, :, 0].argmin(axis=0)
    bwd = totals[best, idx.tensor_range]
    bwd[lay.no_error] = 0.0
    terms[num_layers:] = fwd + bwd
    total = np.cumsum(terms, axis=0)[-1]  # sequential, like the reference's left fold
    return float(total[0]), float(total[1]), float(total[2])


class _Layouts:
    """What :func:`evaluate` reads of an assignment: layer types, and each tensor's layouts."""

    def __init__(self, idx: NetIndex, asg):
        types = np.array(asg.types, dtype=np.int64)
        self.type_i, self.type_ii = types == 0, types == 1
        joins = np.array(asg.joins if asg.joins else [(0, 0)], dtype=np.int64)
        need_of = np.array(NEED)[types]
        kind, pidx = idx.prod_kind, idx.prod_idx
        self.src = np.where(kind == 0, F, np.where(kind == 1, np.array(OUT)[types[np.where(kind == 1, pidx, 0)]],
                                                   joins[np.where(kind == 2, pidx, 0), 0]))
        self.need = np.where(kind == 0, NONE, np.where(kind == 1, self.src, joins[np.where(kind == 2, pidx, 0), 1]))
        self.no_error = self.need == NONE
        self.fl, self.bl = [], []
        for j in range(2):  # each reader: the layout it reads in, the layout of its error
            is_layer = idx.cons_layer[j]
            li, ji = idx.reader_layer[j], idx.reader_join[j]
            self.fl.append(np.where(is_layer, need_of[li], joins[ji, 0]))
            self.bl.append(np.where(is_layer, need_of[li], joins[ji, 1]))
        self.f_same = ((~idx.two) | (self.fl[0] == self.fl[1]))[:, None]
        self.f_same_two = self.f_same & idx.two[:, None]
        b_same = (~idx.two) | (self.bl[0] == self.bl[1])
        self.b_same = b_same[:, None]
        self.b_same_two = (b_same & idx.two)[:, None]
        # flat indices into rel[src, dst] (4 x 4 layouts) of what evaluate reads, 12 rows of tensors:
        # rel[src, fl0], rel[src, fl1], rel[src, F], then for m = 0, 1, 2: rel[m, need], rel[bl0, m], rel[bl1, m]
        rows = [self.src * 4 + self.fl[0], self.src * 4 + self.fl[1], self.src * 4 + F]
        for m in range(3):
            rows += [m * 4 + self.need, self.bl[0] * 4 + m, self.bl[1] * 4 + m]
        self.gather = np.concatenate(rows)


def _layouts(net: Net, idx: NetIndex, asg) -> _Layouts:
    cache = net.__dict__.setdefault("_layouts", {})
    got = cache.get(asg)
    if got is None:
        if len(cache) >= 512:
            cache.pop(next(iter(cache)))
        got = cache[asg] = _Layouts(idx, asg)
    return got
