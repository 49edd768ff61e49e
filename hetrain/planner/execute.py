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

from hetrain.planner.layers import INPUT
from hetrain.planner.program import Program, square_side

__all__ = ["Program", "check_worker", "worker"]


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

    def run(self, transfers, piece, shape_of, deliver):
        """Move ``transfers``; a level's time covers packing, the transfers and unpacking (adding)."""
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
                    ops.append(dist.P2POp(dist.isend, piece(t.box).contiguous(), t.dst, tag=k))
                if t.dst == me:
                    shape = shape_of(t.box)
                    self.count += 1
                    buf = self.pool.get(self.count)
                    if buf is None or tuple(buf.shape) != tuple(shape):
                        buf = self.pool[self.count] = torch.empty(shape, dtype=self.dtype)
                    ops.append(dist.P2POp(dist.irecv, buf, t.src, tag=k))
                    incoming.append((t, buf))
            if ops:
                for req in dist.batch_isend_irecv(ops):
                    req.wait()
                for t, buf in incoming:
                    deliver(t, buf)
                self.bytes[level] += sum(b.numel() * b.element_size() for _, b in incoming)
                self.seconds[level] += time.perf_counter() - start


def _sub(t, box, sub, dims=(0, 1)):
    """The part ``sub`` of a tensor ``t`` that holds global box ``box`` along ``dims``."""
    index = [slice(None)] * t.dim()
    index[dims[0]] = slice(sub[0] - box[0], sub[1] - box[0])
    index[dims[1]] = slice(sub[2] - box[2], sub[3] - box[2])
    return t[tuple(index)]


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
            comm.run(transfers, lambda b: _sub(src, src_box, b), None, None)  # only my sends
            return src  # nothing arrives: no copy
        out = self._zeros(dst_box, inner)
        if own and src is not None and not _empty(src_box):
            mine = intersect(src_box, dst_box)
            if mine is not None:
                _sub(out, dst_box, mine).copy_(_sub(src, src_box, mine))

        def deliver(t, buf):
            view = _sub(out, dst_box, t.box)
            view.add_(buf) if add else view.copy_(buf)

        comm.run(transfers, lambda b: _sub(src, src_box, b), lambda b: (b[1] - b[0], b[3] - b[2], *inner), deliver)
        return out

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
                with clock:
                    x.requires_grad_(True)
                    (i0, i1), (o0, o1) = (need[2], need[3]), (out[2], out[3])
                    w = self.weights[i][i0:i1, o0:o1].detach().requires_grad_(True)
                    la = net.layers[i]
                    if x.numel() == 0 or w.numel() == 0:  # an empty box (a tiny dimension split unevenly)
                        side = square_side(la.hw_out) if la.kind == "conv" else 0
                        y = torch.zeros((out[1] - out[0], o1 - o0, *((side, side) if side else ())), dtype=self.dtype)
                    elif la.kind == "conv":
                        k, stride, pad = p.conv[i]
                        y = F.conv2d(x, w.permute(1, 0, 2, 3), stride=stride, padding=pad)
                    else:
                        y = x @ w
                    partial = y.detach()
                yfull = self._gather(p.plans[("out", nid)], out, partial, out, tuple(y.shape[2:]), comm, add=True)
                with clock:
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
                with clock:
                    pre = total.requires_grad_(True)
                    post = self._post(nid, pre)
                held[nid] = (p.held[nid][me], post.detach())
        # loss: MSE on the last layer's output boxes (complete values after the reduction)
        last = len(net.nodes) - 1
        with clock:
            b0, b1, c0, c1 = p.output_box(net.nodes[last].index, me)
            output = held[last][1]
            err_out = (output - self.target[b0:b1, c0:c1]) / p.batch
        dx_of = {}    # (consumer node, producer) -> (box, contribution)
        grads = {}
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
                with clock:
                    dy = torch.autograd.grad(post, pre, err)[0] if nid != last else err
                    if y.requires_grad:
                        dx, dw = torch.autograd.grad(y, (x, w), dy)
                    else:
                        dx, dw = torch.zeros_like(x), torch.zeros_like(w)
                wbox = p.weight_box(node.index, me)
                grads[node.index] = (wbox, self._gather(p.plans[("dw", nid)], wbox, dw, wbox, tuple(dw.shape[2:]),
                                                        comm, add=True))
                if node.producers[0] != INPUT:
                    dx_of[(nid, node.producers[0])] = (p.input_box(node.index, me), dx)
            else:
                ebox = p.join_box(node.index, me, forward=False)
                with clock:
                    side = p.raw[nid][1]
                    dummy = self._zeros(ebox, (side, side) if side else ()).requires_grad_(True)
                    dpre = torch.autograd.grad(self._post(nid, dummy), dummy, err)[0]
                for q in node.producers:
                    dx_of[(nid, q)] = (ebox, dpre)
        return output, grads

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


class _Clock:
    def __init__(self):
        self.seconds = 0.0

    def __enter__(self):
        self._t = time.perf_counter()

    def __exit__(self, *exc):
        self.seconds += time.perf_counter() - self._t


def worker(ctx, program: Program, dtype_name: str, steps: int, check: bool, calibrate_s: float = 0.0,
           sync: bool = True) -> dict:
    """One rank (run by :func:`hetrain.jobs.local_job.run_local`): a warm-up step, ``steps`` timed
    steps (each right after ``calibrate_s`` seconds of FLOP/s and bandwidth measurement, when > 0, so
    that a shared machine's drift affects both alike), and the check against the unpartitioned step."""
    import torch
    import torch.distributed as dist

    from hetrain.planner.profile import calibrate

    result = {"rank": ctx.rank}
    dtype = getattr(torch, dtype_name)
    levels = max((len(path) for path in program.layout.paths), default=1)
    step = _Step(program, ctx.rank, torch, dist, dtype)
    records, pool = [], {}
    for k in range(steps + 1):  # the first is a warm-up
        cal = calibrate(ctx.rank, ctx.world_size, calibrate_s) if (k and calibrate_s) else None
        comm, clock = _Comm(torch, dist, ctx.rank, dtype, levels, sync, pool), _Clock()
        dist.barrier()
        start = time.perf_counter()
        output, grads = step.run(comm, clock)
        wall = time.perf_counter() - start
        if k:
            records.append({"step_s": wall, "compute_s": clock.seconds, "level_s": comm.seconds,
                            "level_bytes": comm.bytes, "wait_s": comm.wait_s, "calibration": cal})
    result["steps"] = records
    if check:
        ref_out, ref_grads = step.reference()
        b0, b1, c0, c1 = program.output_box(len(program.net.layers) - 1, ctx.rank)
        out_err = float((output - ref_out[b0:b1, c0:c1]).abs().max()) if output.numel() else 0.0
        grad_err, scale = 0.0, 0.0
        for i, (box, g) in grads.items():
            ref = ref_grads[i][box[0]:box[1], box[2]:box[3]]
            if g.numel():
                grad_err = max(grad_err, float((g - ref).abs().max()))
                scale = max(scale, float(ref.abs().max()))
        result.update(output_err=out_err, grad_err=grad_err, grad_scale=scale,
                      output_scale=float(ref_out.abs().max()))
    return result


def check_worker(ctx, programs: list, dtype_name: str = "float64") -> list:
    """Run one step of each program and return (output error, gradient error, gradient scale) for each."""
    import torch.distributed as dist

    out = []
    for program in programs:
        r = worker(ctx, program, dtype_name, steps=1, check=True, sync=False)
        out.append((r["output_err"], r["grad_err"], r["grad_scale"]))
        dist.barrier()
    return out
