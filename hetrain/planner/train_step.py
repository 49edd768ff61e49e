"""One rank's part of training with a plan: its weight shards, biases, cross-entropy, emulated devices.

:class:`TrainStep` runs the partitioned step of :mod:`hetrain.planner.execute`
on real batches and keeps, for every layer, only the shard of the weight that
its compute box multiplies (``(inputs, outputs[, k, k])`` order); the summed
gradient of that shard arrives by the plan's own reduction, and the rank's
optimizer updates the shard where it lives. A weight element held by several
ranks (a type-I split replicates weights) gets the same complete gradient on
each, so the copies stay equal (up to the order of float additions).

Biases: for every (samples, outputs) cell of a layer exactly one rank's box
starts at input feature 0; that rank adds the bias to its partial output
(before the partial sums are added), holds the bias of its outputs and sums
the bias gradient with the other holders of the same outputs.

The loss is cross-entropy over whole rows of logits, while a plan may split
the last layer's outputs: every rank places its box of the logits in a zero
(batch x classes) tensor and one all-reduce gives all ranks the complete logits
(the planner's cost model has no loss term; this all-reduce of batch x classes
elements is the one exchange outside the plan).

Emulated devices (:class:`EmulatedClock`, :class:`EmulatedComm`): each compute
block is padded to its FLOPs at the rank's device FLOP/s, each exchange to the
bytes its group's halves receive at their aggregate link bandwidth (the cost
model's rule, applied to the bytes the step really moves), both times
``scale`` (emulated seconds per device second).
"""

from __future__ import annotations

import math
import time

from hetrain.planner.boxes import allreduce_rounds, area
from hetrain.planner.execute import _Clock, _Comm, _Step
from hetrain.planner.layers import INPUT
from hetrain.planner.program import square_side


def _worse(a: float, b: float) -> float:
    """The larger difference; NaN if either is NaN (no agreement)."""
    return math.nan if math.isnan(a) or math.isnan(b) else max(a, b)


def _pad_until(deadline: float) -> None:
    left = deadline - time.perf_counter()
    if left > 0:
        time.sleep(left)


class EmulatedClock(_Clock):
    """Compute blocks padded to ``flops / flops_per_s * scale`` seconds (real time counts toward it)."""

    def __init__(self, flops_per_s: float, scale: float):
        super().__init__()
        self.flops_per_s, self.scale, self._flops = flops_per_s, scale, 0.0

    def __call__(self, flops: float = 0.0):
        self._flops = flops
        return self

    def __exit__(self, *exc):
        _pad_until(self._t + self._flops / self.flops_per_s * self.scale)
        super().__exit__(*exc)


class EmulatedComm(_Comm):
    """Each level's exchange padded to max over the group's halves of (bytes received / the half's
    aggregate link bandwidth), times ``scale``: the cost model's rule on the bytes really moved."""

    def __init__(self, torch, dist, rank, dtype, levels, paths, link_bytes_per_s, scale, pool=None):
        super().__init__(torch, dist, rank, dtype, levels, sync=False, pool=pool)
        self.paths, self.link, self.scale = paths, link_bytes_per_s, scale
        self.elem_bytes = torch.empty((), dtype=dtype).element_size()

    def _exchanged(self, level, transfers, inner, start):
        mine = self.paths[self.rank][:level]
        received = [0.0, 0.0]
        for t in transfers:
            if t.level == level and self.paths[t.dst][:level] == mine:
                received[self.paths[t.dst][level]] += area(t.box) * getattr(t, "cells", inner) * self.elem_bytes
        if not any(received):
            return
        group = [r for r, path in enumerate(self.paths) if path[:level] == mine]
        seconds = 0.0
        for side in (0, 1):
            bandwidth = sum(self.link[r] for r in group if self.paths[r][level] == side)
            if received[side]:
                seconds = max(seconds, received[side] / bandwidth)
        _pad_until(start + seconds * self.scale)


class TrainStep(_Step):
    """A rank's shards of a real model, one partitioned training step at a time.

    ``weights[i]``: layer i's full weight in (inputs, outputs[, k, k]) order, ``biases[i]`` its bias or
    None; every rank is given the same full tensors and keeps only its pieces.
    """

    def __init__(self, program, rank: int, torch, dist, dtype, weights, biases):
        self.p, self.me, self.torch, self.dist, self.dtype = program, rank, torch, dist, dtype
        lay = program.layout
        self.shards, self.biases, self.bias_boxes, self.bias_plans = [], {}, {}, {}
        for i in range(len(program.net.layers)):
            i0, i1, o0, o1 = program.weight_box(i, rank)
            self.shards.append(weights[i][i0:i1, o0:o1].to(dtype).clone())
            if biases[i] is None:
                continue
            boxes = []
            for r in range(lay.world):
                b = program.weight_box(i, r)
                boxes.append((0, 1, b[2], b[3]) if b[0] == 0 and b[1] > b[0] and b[3] > b[2] else None)
            self.bias_boxes[i] = boxes
            self.bias_plans[i] = allreduce_rounds(lay, boxes)
            if boxes[rank] is not None:
                self.biases[i] = biases[i][o0:o1].to(dtype).clone()
        self.bias_grads, self.loss = {}, float("nan")
        self.x = self.labels = None

    def parameters(self):
        """Every tensor this rank updates: its weight shards, then the biases it holds."""
        return [*self.shards, *self.biases.values()]

    def pieces(self, weights, biases):
        """This rank's pieces of whole tensors (executor layout), in the order of :meth:`parameters`."""
        shards = []
        for i in range(len(self.shards)):
            i0, i1, o0, o1 = self.p.weight_box(i, self.me)
            shards.append(weights[i][i0:i1, o0:o1])
        held = []
        for i in self.biases:
            _, _, o0, o1 = self.p.weight_box(i, self.me)
            held.append(biases[i][o0:o1])
        return shards + held

    def set_batch(self, x, labels):
        """The global batch (every rank reads the same one and multiplies its boxes' rows)."""
        c0, side = self.p.domain[INPUT]
        self.x = x.reshape(x.shape[0], c0, side, side).to(self.dtype) if side else x.reshape(x.shape[0], c0).to(
            self.dtype)
        self.labels = labels

    # -- the hooks of the partitioned step ----------------------------------------------------------
    def _weight(self, i, box):
        assert box == self.p.weight_box(i, self.me), "a rank multiplies only its own shard"
        return self.shards[i]

    def _add_bias(self, i, need, partial):
        b = self.biases.get(i)
        if b is None or need[2] != 0 or partial.numel() == 0:
            return partial
        return partial + b.reshape(1, -1, *([1] * (partial.dim() - 2)))

    def _bias_entry(self, i, need, dy):
        if i not in self.bias_plans:
            return None
        box = self.bias_boxes[i][self.me]
        partial = None if box is None else dy.sum(dim=[d for d in range(dy.dim()) if d != 1]).reshape(1, -1)
        return self.bias_plans[i], box, partial, ()

    def _bias_done(self, i, total):
        if self.bias_boxes[i][self.me] is not None:
            self.bias_grads[i] = total.reshape(-1)

    def _output_error(self, output, box, clock):
        torch, F = self.torch, self.torch.nn.functional
        b0, b1, c0, c1 = box
        classes = self.p.net.layers[-1].d_out
        logits = torch.zeros((self.p.batch, classes), dtype=self.dtype)
        count = torch.zeros((self.p.batch, classes), dtype=self.dtype)
        if output.numel():
            logits[b0:b1, c0:c1] = output
            count[b0:b1, c0:c1] = 1
        both = torch.stack([logits, count])
        self.dist.all_reduce(both)
        logits = both[0] / both[1]
        with clock():
            self.loss = float(F.cross_entropy(logits, self.labels))
            err = (torch.softmax(logits, dim=1) - F.one_hot(self.labels, classes).to(self.dtype)) / self.p.batch
            return err[b0:b1, c0:c1]

    def gradients(self, grads):
        """The complete gradients of :meth:`parameters`, in the same order, from the step's output."""
        return [grads[i][1] for i in range(len(self.shards))] + [self.bias_grads[i] for i in self.biases]

    # -- the whole model, for the checks ---------------------------------------------------------
    def gathered(self, values=None):
        """(weights, biases, disagreement): the full tensors assembled from every rank's pieces (one
        all-reduce each) and the largest difference between a piece and the assembled value (copies of
        one element held by several ranks are averaged). ``values``: tensors in the order of
        :meth:`parameters` to assemble instead of the parameters (the optimizer's momentum, say)."""
        torch, p = self.torch, self.p
        values = self.parameters() if values is None else values
        shards, held = values[:len(self.shards)], dict(zip(self.biases, values[len(self.shards):]))
        weights, biases, worst = [], [], 0.0
        for i, la in enumerate(p.net.layers):
            k = square_side(la.kernel) if la.kind == "conv" else 0
            full = torch.zeros((2, la.d_in, la.d_out, *((k, k) if k else ())), dtype=self.dtype)
            i0, i1, o0, o1 = p.weight_box(i, self.me)
            full[0, i0:i1, o0:o1] = shards[i]
            full[1, i0:i1, o0:o1] = 1
            self.dist.all_reduce(full)
            weights.append(full[0] / full[1])
            if shards[i].numel():
                worst = _worse(worst, float((shards[i] - weights[i][i0:i1, o0:o1]).abs().max()))
            if i not in self.bias_boxes:
                biases.append(None)
                continue
            bias = torch.zeros((2, la.d_out), dtype=self.dtype)
            if i in held:
                bias[0, o0:o1], bias[1, o0:o1] = held[i], 1
            self.dist.all_reduce(bias)
            biases.append(bias[0] / bias[1])
            if i in held and held[i].numel():
                worst = _worse(worst, float((held[i] - biases[i][o0:o1]).abs().max()))
        return weights, biases, worst


def reference_step(program, torch, weights, biases, x, labels):
    """The unpartitioned step of the re-created network: (loss, weight gradients, bias gradients)."""
    F = torch.nn.functional
    net = program.net
    ws = [w.clone().requires_grad_(True) for w in weights]
    bs = [None if b is None else b.clone().requires_grad_(True) for b in biases]
    step = _Step.__new__(_Step)
    step.p, step.torch = program, torch
    vals = {INPUT: x}
    for nid, node in enumerate(net.nodes):
        if node.kind == "layer":
            i, v = node.index, vals[node.producers[0]]
            if net.layers[i].kind == "conv":
                _, stride, pad = program.conv[i]
                y = F.conv2d(v, ws[i].permute(1, 0, 2, 3), bs[i], stride=stride, padding=pad)
            else:
                y = v @ ws[i] + (bs[i] if bs[i] is not None else 0)
        else:
            y = vals[node.producers[0]] + vals[node.producers[1]]
        vals[nid] = step._post(nid, y)
    loss = F.cross_entropy(vals[len(net.nodes) - 1], labels)
    loss.backward()
    return float(loss.detach()), [w.grad for w in ws], [None if b is None else b.grad for b in bs]
