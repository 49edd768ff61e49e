"""One real training step of a planned partitioning, on local gloo processes (one per device).

Every rank multiplies only its compute boxes (:mod:`hetrain.planner.boxes`) and
the pieces that the plan's layouts say must move are moved point to point,
level by level: forward, each layer's input is fetched where it is missing and
its partial outputs are summed where they overlap; backward, partial input
errors and partial weight gradients are summed the same way. So types I, II
and III, unequal ratios and residual joins all run for real, and each transfer
is timed under the level at which its two ranks part in the hierarchy.

The network is re-created from the planner's layer table: Linear and Conv2d
layers (stride and padding inferred from the sizes), ReLU after a layer unless
it feeds a join (pre-activation residual blocks: nothing after an addition),
average pooling and flattening where the next layer reads a smaller or flat
input, an MSE loss. Weights and data are seeded, so every rank can also run
the unpartitioned step and check its own pieces of the outputs and gradients.
Layers on sequences (attention models) are not supported here.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from hetrain.planner.boxes import Transfer
from hetrain.planner.layers import INPUT
from hetrain.planner.program import Program, square_side

__all__ = ["Program"]


# ---- the worker -------------------------------------------------------------------------------------

class _Comm:
    """Point-to-point exchanges, level by level, each timed into ``seconds[level]``.

    With ``sync``, all ranks meet at a barrier before each exchange (timed into
    ``wait_s``), so that ``seconds`` holds transfer time, not time spent waiting
    for a partner that is still computing.
    """

    def __init__(self, torch, dist, rank, dtype, levels, sync=False, pool=None):
        self.torch, self.dist, self.rank, self.dtype, self.sync = torch, dist, rank, dtype, sync
        self.seconds = [0.0] * max(levels, 1)
        self.bytes = [0] * max(levels, 1)
        self.wait_s = 0.0
        self.pool = {} if pool is None else pool  # receive buffers, reused step after step
        self.count = 0

    def run(self, transfers, piece, shape_of, deliver, inner: int = 1):
        """Move ``transfers``; a level's time covers packing, the transfers and unpacking (adding).

        ``piece(t)``: the tensor a transfer sends, ``shape_of(t)``: the shape it receives,
        ``deliver(t, buffer)``: what is done with what arrived.

        ``inner``: elements per (row, column) cell of a box (a feature map's positions), for
        subclasses that account bytes of transfers they do not take part in."""
        torch, dist, me = self.torch, self.dist, self.rank
        for level in sorted({t.level for t in transfers}):
            if self.sync:
                start = time.perf_counter()
                dist.barrier()
                self.wait_s += time.perf_counter() - start
            start = time.perf_counter()
            ops, incoming = [], []
            for k, t in enumerate(transfers):
                if t.level != level:
                    continue
                if t.src == me:
                    ops.append(dist.P2POp(dist.isend, piece(t).contiguous(), t.dst, tag=k))
                if t.dst == me:
                    shape = shape_of(t)
                    self.count += 1
                    buf = self.pool.get(self.count)
                    if buf is None or tuple(buf.shape) != tuple(shape) or buf.dtype != self.dtype:
                        buf = self.pool[self.count] = torch.empty(shape, dtype=self.dtype)
                    ops.append(dist.P2POp(dist.irecv, buf, t.src, tag=k))
                    incoming.append((t, buf))
            if ops:
                for req in dist.batch_isend_irecv(ops):
                    req.wait()
                for t, buf in incoming:
                    deliver(t, buf)
                self.bytes[level] += sum(b.numel() * b.element_size() for _, b in incoming)
            self._exchanged(level, transfers, inner, start)
            if ops:
                self.seconds[level] += time.perf_counter() - start

    def _exchanged(self, level, transfers, inner, start):
        """Called after each level's exchange (whether or not this rank took part); a hook."""


def _sub(t, box, sub, dims=(0, 1)):
    """The part ``sub`` of a tensor ``t`` that holds global box ``box`` along ``dims``."""
    index = [slice(None)] * t.dim()
    index[dims[0]] = slice(sub[0] - box[0], sub[1] - box[0])
    index[dims[1]] = slice(sub[2] - box[2], sub[3] - box[2])
    return t[tuple(index)]


def _extent(box):
    return box[1] - box[0], box[3] - box[2]


@dataclass(frozen=True)
class Keyed(Transfer):
    """A transfer of one of several tensors moved together: ``key`` names the tensor, ``cells`` its
    elements per (row, column) cell."""

    key: int = 0
    cells: int = 1


def _empty(box) -> bool:
    return box is None or box[0] >= box[1] or box[2] >= box[3]


class _Step:
    """The tensors of one rank: weights, data, and one forward/backward pass over its boxes."""

    def __init__(self, program: Program, rank: int, torch, dist, dtype, seed: int = 0):
        self.p, self.me, self.torch, self.dist, self.dtype = program, rank, torch, dist, dtype
        net, B = program.net, program.batch
        gen = torch.Generator().manual_seed(seed)
        self.weights = []
        for la in net.layers:
            k = square_side(la.kernel) if la.kind == "conv" else 0
            shape = (la.d_in, la.d_out, k, k) if k else (la.d_in, la.d_out)
            self.weights.append(torch.randn(shape, generator=gen, dtype=dtype) / math.sqrt(la.d_in * max(k, 1) ** 2))
        c0, side = program.domain[INPUT]
        self.x = torch.randn((B, c0, side, side) if side else (B, c0), generator=gen, dtype=dtype)
        last = net.layers[-1]
        out_side = square_side(last.hw_out) if last.kind == "conv" else 0
        self.target = torch.randn((B, last.d_out, out_side, out_side) if out_side else (B, last.d_out), generator=gen,
                                  dtype=dtype)

    # -- local pieces ----------------------------------------------------------------------------
    def _inner(self, p):
        side = self.p.domain[p][1] if p in self.p.domain else self.p.raw[p][1]
        return (side, side) if side else ()

    def _zeros(self, box, inner):
        return self.torch.zeros((box[1] - box[0], box[3] - box[2], *inner), dtype=self.dtype)

    def _gather(self, transfers, src_box, src, dst_box, inner, comm, add=False, own=True):
        """A tensor on ``dst_box``: my own overlap of ``src`` (when ``own``), plus what the transfers bring."""
        from hetrain.planner.boxes import intersect

        if own and src is not None and src_box == dst_box and all(t.dst != self.me for t in transfers):
            comm.run(transfers, lambda t: _sub(src, src_box, t.box), None, None, math.prod(inner))  # only my sends
            return src  # nothing arrives: no copy
        out = self._zeros(dst_box, inner)
        if own and src is not None and not _empty(src_box):
            mine = intersect(src_box, dst_box)
            if mine is not None:
                _sub(out, dst_box, mine).copy_(_sub(src, src_box, mine))

        def deliver(t, buf):
            view = _sub(out, dst_box, t.box)
            view.add_(buf) if add else view.copy_(buf)

        comm.run(transfers, lambda t: _sub(src, src_box, t.box), lambda t: (*_extent(t.box), *inner), deliver,
                 math.prod(inner))
        return out

    def _reduce(self, rounds, box, partial, inner, comm):
        """``partial`` (on ``box``) summed with every other rank's over the box (see :meth:`_reduce_all`)."""
        return self._reduce_all([(rounds, box, partial, inner)], comm)[0]

    def _reduce_all(self, entries, comm):
        """Each entry's ``partial`` (on its ``box``) summed with every other rank's over the box, by its
        rounds (:func:`hetrain.planner.boxes.allreduce_rounds`); the rounds of all entries at the same phase
        and level move together (one exchange for all the weight gradients of a step, as a bucketed
        all-reduce does). ``entries``: ``(rounds, box, partial, inner)``; returns the sums in order."""
        outs = [partial for _, _, partial, _ in entries]
        merged: dict = {}
        for key, (rounds, _, partial, inner) in enumerate(entries):
            cells = math.prod(inner)
            for mode, transfers in rounds:
                level = transfers[0].level
                phase = (0, -level) if mode == "add" else (1, level)
                for t in transfers:
                    if self.me in (t.src, t.dst) and outs[key] is partial:
                        outs[key] = partial.clone()  # this rank's sums change: not the caller's tensor
                    merged.setdefault(phase, []).append(Keyed(t.src, t.dst, t.box, t.level, key, cells))
        boxes = [box for _, box, _, _ in entries]
        inners = [inner for _, _, _, inner in entries]
        for phase in sorted(merged):
            add = phase[0] == 0

            def deliver(t, buf, add=add):
                view = _sub(outs[t.key], boxes[t.key], t.box)
                view.add_(buf) if add else view.copy_(buf)

            comm.run(merged[phase], lambda t: _sub(outs[t.key], boxes[t.key], t.box),
                     lambda t: (*_extent(t.box), *inners[t.key]), deliver)
        return outs

    def _post(self, p, y):
        """ReLU (unless p feeds a join), pooling to the consumers' size, flattening where they read vectors."""
        F = self.torch.nn.functional
        if p in self.p.consumers and self.p.relu(p):
            y = F.relu(y)
        if p not in self.p.domain:
            return y
        dom_c, dom_side = self.p.domain[p]
        raw_c, raw_side = self.p.raw[p]
        if raw_side and not dom_side:  # flatten after pooling to the classifier's grid
            grid = math.isqrt(dom_c // raw_c)
            if grid != raw_side:
                y = F.adaptive_avg_pool2d(y, grid)
            return y.reshape(y.shape[0], math.prod(y.shape[1:]))
        if raw_side and dom_side != raw_side:
            y = F.adaptive_avg_pool2d(y, dom_side)
        return y

    # -- one step --------------------------------------------------------------------------------
    def run(self, comm, clock):
        torch, p, me = self.torch, self.p, self.me
        F = torch.nn.functional
        net = p.net
        held = {INPUT: (p.held[INPUT][me], self.x)}
        saved = {}
        for nid, node in enumerate(net.nodes):
            if node.kind == "layer":
                i, src = node.index, node.producers[0]
                need, out = p.input_box(i, me), p.output_box(i, me)
                hb, ht = held[src]
                x = self._gather(p.plans[("in", nid)], hb, ht, need, self._inner(src), comm)
                la = net.layers[i]
                with clock(_box_flops(la, need, out)):
                    x.requires_grad_(True)
                    (i0, i1), (o0, o1) = (need[2], need[3]), (out[2], out[3])
                    w = self._weight(i, (i0, i1, o0, o1)).detach().requires_grad_(True)
                    if x.numel() == 0 or w.numel() == 0:  # an empty box (a tiny dimension split unevenly)
                        side = square_side(la.hw_out) if la.kind == "conv" else 0
                        y = torch.zeros((out[1] - out[0], o1 - o0, *((side, side) if side else ())), dtype=self.dtype)
                    elif la.kind == "conv":
                        k, stride, pad = p.conv[i]
                        y = F.conv2d(x, w.permute(1, 0, 2, 3), stride=stride, padding=pad)
                    else:
                        y = x @ w
                    partial = self._add_bias(i, need, y.detach())
                yfull = self._reduce(p.reductions[("out", nid)], out, partial, tuple(y.shape[2:]), comm)
                with clock():
                    pre = yfull.requires_grad_(True)
                    post = self._post(nid, pre)
                held[nid] = (p.held[nid][me] if nid in p.held else out, post.detach())
                saved[nid] = (x, w, y, pre, post)
            else:
                a = node.index
                box = p.join_box(a, me, forward=True)
                total = None
                for q in node.producers:
                    hb, ht = held[q]
                    part = self._gather(p.plans[("in", nid, q)], hb, ht, box, self._inner(q), comm)
                    total = part if total is None else total + part
                with clock():
                    pre = total.requires_grad_(True)
                    post = self._post(nid, pre)
                held[nid] = (p.held[nid][me], post.detach())
        last = len(net.nodes) - 1
        output = held[last][1]
        err_out = self._output_error(output, p.output_box(net.nodes[last].index, me), clock)
        dx_of = {}    # (consumer node, producer) -> (box, contribution)
        grads = {}
        pending, owners = [], []  # weight (and bias) gradients, reduced together after the backward pass
        for nid in reversed(range(len(net.nodes))):
            node = net.nodes[nid]
            if nid == last:
                err = err_out
            else:
                box = p.err[nid][me]
                err = self._zeros(box, self._inner(nid))
                for c in p.consumers[nid]:
                    cbox, ct = dx_of[(c, nid)]
                    plan_key = ("dx", c) if net.nodes[c].kind == "layer" else ("dx", c, nid)
                    err = err + self._gather(p.plans[plan_key], cbox, ct, box, self._inner(nid), comm,
                                             add=net.nodes[c].kind == "layer")
            if node.kind == "layer":
                x, w, y, pre, post = saved[nid]
                la = net.layers[node.index]
                need, out = p.input_box(node.index, me), p.output_box(node.index, me)
                first = node.producers[0] == INPUT
                with clock(_box_flops(la, need, out) * (1 if first else 2)):  # no input error for the first layer
                    dy = torch.autograd.grad(post, pre, err)[0] if nid != last else err
                    if y.requires_grad:
                        dx, dw = torch.autograd.grad(y, (x, w), dy)
                    else:
                        dx, dw = torch.zeros_like(x), torch.zeros_like(w)
                wbox = p.weight_box(node.index, me)
                pending.append((p.reductions[("dw", nid)], wbox, dw, tuple(dw.shape[2:])))
                owners.append((node.index, wbox))
                bias = self._bias_entry(node.index, need, dy)
                if bias is not None:
                    pending.append(bias)
                    owners.append((node.index, None))
                if node.producers[0] != INPUT:
                    dx_of[(nid, node.producers[0])] = (p.input_box(node.index, me), dx)
            else:
                ebox = p.join_box(node.index, me, forward=False)
                with clock():
                    side = p.raw[nid][1]
                    dummy = self._zeros(ebox, (side, side) if side else ()).requires_grad_(True)
                    dpre = torch.autograd.grad(self._post(nid, dummy), dummy, err)[0]
                for q in node.producers:
                    dx_of[(nid, q)] = (ebox, dpre)
        for (i, wbox), total in zip(owners, self._reduce_all(pending, comm)):
            if wbox is None:
                self._bias_done(i, total)
            else:
                grads[i] = (wbox, total)
        return output, grads

    # -- what a training step changes (see hetrain.planner.train_step) ----------------------------
    def _weight(self, i, box):
        """Layer ``i``'s weight on ``box`` = (i0, i1, o0, o1), in (inputs, outputs[, k, k]) order."""
        return self.weights[i][box[0]:box[1], box[2]:box[3]]

    def _add_bias(self, i, need, partial):
        """The partial output with the bias added (none here: the check's layers have no bias)."""
        return partial

    def _bias_entry(self, i, need, dy):
        """Layer ``i``'s bias gradient as a :meth:`_reduce_all` entry, or None (no bias here)."""
        return None

    def _bias_done(self, i, total):
        """The summed bias gradient of layer ``i`` (None on a rank that holds none of the bias)."""

    def _output_error(self, output, box, clock):
        """The loss's error on this rank's box of the last layer's output: MSE here."""
        b0, b1, c0, c1 = box
        with clock():
            return (output - self.target[b0:b1, c0:c1]) / self.p.batch

    def reference(self):
        """The unpartitioned step on this rank: (output, weight gradients), for the check."""
        torch, p = self.torch, self.p
        F = torch.nn.functional
        net = p.net
        ws = [w.clone().requires_grad_(True) for w in self.weights]
        vals = {INPUT: self.x}
        for nid, node in enumerate(net.nodes):
            if node.kind == "layer":
                i, x = node.index, vals[node.producers[0]]
                if net.layers[i].kind == "conv":
                    k, stride, pad = p.conv[i]
                    y = F.conv2d(x, ws[i].permute(1, 0, 2, 3), stride=stride, padding=pad)
                else:
                    y = x @ ws[i]
            else:
                y = vals[node.producers[0]] + vals[node.producers[1]]
            vals[nid] = self._post(nid, y)
        out = vals[len(net.nodes) - 1]
        loss = 0.5 * ((out - self.target) ** 2).sum() / p.batch
        loss.backward()
        return out.detach(), [w.grad for w in ws]


def gradient_error(grads: dict, reference: list) -> tuple[float, float]:
    """(largest absolute difference, largest reference value) of a step's weight gradients (box, tensor)
    against the whole model's, each rank over its own boxes."""
    err, scale = 0.0, 0.0
    for i, (box, g) in grads.items():
        ref = reference[i][box[0]:box[1], box[2]:box[3]]
        if g.numel():
            err = max(err, float((g - ref).abs().max()))
            scale = max(scale, float(ref.abs().max()))
    return err, scale


def _box_flops(la, need, out) -> float:
    """Forward FLOPs of one rank's box of layer ``la`` (2 per multiply-add), as the planner counts them."""
    return 2.0 * (out[1] - out[0]) * (need[3] - need[2]) * (out[3] - out[2]) * la.kernel * la.hw_out


class _Clock:
    """Compute time; ``with clock(flops):`` (a subclass may pad the block to an emulated device's time)."""

    def __init__(self):
        self.seconds = 0.0

    def __call__(self, flops: float = 0.0):
        return self

    def __enter__(self):
        self._t = time.perf_counter()

    def __exit__(self, *exc):
        self.seconds += time.perf_counter() - self._t
