"""What every process of a partitioned step needs to know, computed once from the net and the plan.

The network is re-created from the planner's layer table: a tensor's *domain*
is what its readers see (channels and a square feature map, or flat features
after flattening), its *raw* shape what the producing layer or join outputs.
For every rank: the box of each tensor it holds forward and the box its error
is needed on (:mod:`hetrain.planner.boxes`); for every exchange of a step, the
list of transfers. Pure Python (no torch).
"""

from __future__ import annotations

import math

from hetrain.errors import UsageError
from hetrain.planner.boxes import Layout, allreduce_rounds, fetch_plan, reduce_plan
from hetrain.planner.layers import INPUT


class Program:
    """What every rank needs to know to run a step: domains, post-ops, boxes and transfer lists."""

    def __init__(self, net, batch: int, plan):
        self.net, self.batch = net, batch
        self.layout = lay = Layout(net, batch, plan)
        nodes = net.nodes
        self.consumers: dict[int, list[int]] = {}
        for nid, node in enumerate(nodes):
            for p in node.producers:
                self.consumers.setdefault(p, []).append(nid)
        self.conv = {i: _conv_geometry(net, la) for i, la in enumerate(net.layers) if la.kind == "conv"}
        for la in net.layers:
            if la.kind == "linear" and la.hw_in != 1:
                raise UsageError(f"--measure: {net.name} has layers on sequences ({la.name}); measure chains and "
                                 "residual blocks of Linear/Conv2d layers (e.g. mlp, lenet, resnet-18 at 3,32,32)")
        self.raw = {p: self._raw(p) for p in [INPUT, *range(len(nodes))]}  # (channels, side) before post-ops
        self.domain = {p: self._domain(p) for p in self.consumers}          # (features, side) read by consumers
        W = lay.world
        self.held, self.err = {}, {}
        for p in self.consumers:
            self.held[p] = [self._held(p, r, fwd=True) for r in range(W)]
            self.err[p] = [self._held(p, r, fwd=False) for r in range(W)]
        self.plans = {}        # fetches (and the input errors' reductions): one list of transfers each
        self.reductions = {}   # sums over the same boxes (outputs, weight gradients): rounds, see allreduce_rounds
        for nid, node in enumerate(nodes):
            p = node.producers[0]
            if node.kind == "layer":
                i = node.index
                need = [self.input_box(i, r) for r in range(W)]
                out = [self.output_box(i, r) for r in range(W)]
                wbox = [self.weight_box(i, r) for r in range(W)]
                self.plans[("in", nid)] = fetch_plan(lay, self.held[p], need)
                self.reductions[("out", nid)] = allreduce_rounds(lay, out)
                self.reductions[("dw", nid)] = allreduce_rounds(lay, wbox)
                if p != INPUT:
                    self.plans[("dx", nid)] = reduce_plan(lay, need, self.err[p])
            else:
                for q in node.producers:
                    jbox = [self.join_box(node.index, r, forward=True) for r in range(W)]
                    self.plans[("in", nid, q)] = fetch_plan(lay, self.held[q], jbox)
                    ebox = [self.join_box(node.index, r, forward=False) for r in range(W)]
                    self.plans[("dx", nid, q)] = fetch_plan(lay, ebox, self.err[q])
        levels = max((len(path) for path in lay.paths), default=1)
        self.rounds = [0] * max(levels, 1)  # exchange rounds per level in one step (each plan runs once)
        for transfers in self.plans.values():
            for level in {t.level for t in transfers}:
                self.rounds[level] += 1
        for rounds in self.reductions.values():
            for _, transfers in rounds:
                self.rounds[transfers[0].level] += 1

    # ---- geometry -------------------------------------------------------------------------------
    def _raw(self, p):
        net = self.net
        if p == INPUT:
            first = net.layers[net.nodes[self.consumers[INPUT][0]].index]
            return first.d_in, square_side(first.hw_in) if first.kind == "conv" else 0
        node = net.nodes[p]
        if node.kind == "layer":
            la = net.layers[node.index]
            return la.d_out, square_side(la.hw_out) if la.kind == "conv" else 0
        src = net.layers[net.add_source(node.index)]
        return src.d_out, square_side(src.hw_out) if src.kind == "conv" else 0

    def _domain(self, p):
        net, found = self.net, set()
        for c in self.consumers[p]:
            node = net.nodes[c]
            if node.kind == "layer":
                la = net.layers[node.index]
                found.add((la.d_in, square_side(la.hw_in)) if la.kind == "conv" else (la.d_in, 0))
            else:
                found.add(self.raw[c])
        if len(found) != 1:
            raise UsageError(f"--measure: a tensor of {net.name} is read in {len(found)} different shapes")
        return found.pop()

    def scale(self, p) -> int:
        """Features of p's domain per channel of its raw output (flattening multiplies)."""
        raw_c, _ = self.raw[p]
        dom_c, dom_side = self.domain[p]
        if dom_c % raw_c:
            raise UsageError(f"--measure: cannot map {raw_c} channels onto {dom_c} features in {self.net.name}")
        return dom_c // raw_c

    def relu(self, p) -> bool:
        if p == INPUT or self.net.nodes[p].kind != "layer":
            return False
        return all(self.net.nodes[c].kind == "layer" for c in self.consumers.get(p, []))

    def _held(self, p, r, fwd):
        lay, B = self.layout, self.batch
        if p == INPUT:
            return (0, B, 0, self.domain[p][0]) if fwd else None
        node, k = self.net.nodes[p], self.scale(p)
        if node.kind == "layer":
            (b0, b1), _, (o0, o1) = lay.compute[r][node.index]
        else:
            b0, b1, o0, o1 = (lay.join_fwd if fwd else lay.join_err)[r][node.index]
        return b0, b1, o0 * k, o1 * k

    # ---- what one rank computes (the step's boxes; execute.py reads these) ----------------------
    def input_box(self, i, r):
        """(b0, b1, i0, i1): the samples and input features rank ``r`` reads for layer ``i``."""
        (b0, b1), (i0, i1), _ = self.layout.compute[r][i]
        return b0, b1, i0, i1

    def output_box(self, i, r):
        """(b0, b1, o0, o1): the samples and output features of layer ``i`` rank ``r`` computes (and holds
        complete once its partial sums are reduced)."""
        (b0, b1), _, (o0, o1) = self.layout.compute[r][i]
        return b0, b1, o0, o1

    def weight_box(self, i, r):
        """(i0, i1, o0, o1): the part of layer ``i``'s weight (inputs x outputs) rank ``r`` multiplies."""
        _, (i0, i1), (o0, o1) = self.layout.compute[r][i]
        return i0, i1, o0, o1

    def join_box(self, a, r, forward: bool = True):
        """The box of join (addition) ``a`` that rank ``r`` sums forward, or holds the join's error on backward."""
        return (self.layout.join_fwd if forward else self.layout.join_err)[r][a]


def square_side(hw: int) -> int:
    """The side of a square feature map of ``hw`` positions."""
    s = math.isqrt(hw)
    if s * s != hw:
        raise UsageError(f"--measure: feature maps must be square, got {hw} positions")
    return s


def _conv_geometry(net, la):
    """(kernel side, stride, padding) of a convolution: as traced (or built by the zoo) where the layer records
    them; for a hand-built table without them, the pair that turns hw_in into hw_out (padding as close to 'same'
    as possible). Only what the executor runs is accepted: square kernels, equal strides and paddings, zero
    padding, no dilation."""
    where = f"{la.name} in {net.name}"
    k = math.isqrt(la.kernel)
    if k * k != la.kernel:
        raise UsageError(f"--measure: {where} has a kernel of {la.kernel} positions; the executor runs square kernels")
    si, so = square_side(la.hw_in), square_side(la.hw_out)
    if la.dilation is not None and tuple(la.dilation) != (1, 1):
        raise UsageError(f"--measure: {where} is a dilated convolution (dilation {tuple(la.dilation)}); the "
                         "executor runs dilation 1 only")
    if la.padding_mode != "zeros":
        raise UsageError(f"--measure: {where} pads with {la.padding_mode!r}; the executor pads with zeros only")
    if la.stride is None and la.padding is None:
        for pad in range(k // 2, -1, -1):
            for stride in range(1, si + 1):
                if (si + 2 * pad - k) // stride + 1 == so:
                    return k, stride, pad
        raise UsageError(f"--measure: no stride/padding maps {si}x{si} to {so}x{so} for {where}")
    stride = tuple(la.stride) if la.stride is not None else (1, 1)
    padding = la.padding
    if padding == "valid":
        padding = (0, 0)
    elif padding == "same":
        if stride != (1, 1) or (k - 1) % 2:
            raise UsageError(f"--measure: {where} pads 'same' with an even kernel; the executor needs equal padding "
                             "on both sides")
        padding = ((k - 1) // 2, (k - 1) // 2)
    padding = tuple(padding) if padding is not None else (0, 0)
    if len(set(stride)) != 1 or len(set(padding)) != 1:
        raise UsageError(f"--measure: {where} has stride {stride} and padding {padding}; the executor needs the same "
                         "stride and padding along both sides")
    stride, pad = stride[0], padding[0]
    if (si + 2 * pad - k) // stride + 1 != so:
        raise UsageError(f"--measure: {where}: stride {stride} and padding {pad} do not map {si}x{si} to {so}x{so}")
    return k, stride, pad
