"""Executable check of a plan: run a partitioned MLP on gloo processes, compare with plain autograd.

Every rank owns, for each layer, the block (batch rows x input features x
output features) that the plan's hierarchy gives it: each level cuts the
range of the layer's split dimension (I: batch, II: Di, III: Do) at its ratio,
left half first. A rank multiplies only its blocks; the partial sums are then
reduced with real collectives (forward outputs, weight gradients, input errors
each by an all-reduce of the rank's block placed in a zero tensor), so the
check is that the plan's partition of every layer is complete and that its
partial sums add up to the unpartitioned loss and gradients, in float64.
Communication is deliberately simple here; the cost model prices it.

The ranks run under the project's launcher (:func:`hetrain.jobs.run_local`):
warm processes, a FileStore in a temporary directory, at most ``timeout_s``
for any wait and for the whole run, all ranks killed when one fails.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

TOLERANCE = 1e-5
SIZES = (24, 40, 32, 8)  # the MLP checked: 24 -> 40 -> 32 -> 8, ReLU between, no bias
BATCH = 12


@dataclass
class Split:
    """One level of a hand-written or planned hierarchy: ratio, types per layer, two halves (None = device)."""

    alpha: float
    types: tuple[int, ...]
    left: Split | None = None
    right: Split | None = None


@dataclass
class VerifyReport:
    case: str
    world: int
    loss_err: float
    grad_err: float
    seconds: float

    @property
    def ok(self) -> bool:
        return self.loss_err <= TOLERANCE and self.grad_err <= TOLERANCE

    def line(self) -> str:
        verdict = "ok" if self.ok else f"FAILED (tolerance {TOLERANCE:g})"
        return (f"verify {self.case:<28} {self.world} processes: max abs error loss {self.loss_err:.2e}, "
                f"gradients {self.grad_err:.2e} ({self.seconds:.1f} s) {verdict}")


def from_plan(g) -> Split | None:
    """A :class:`Split` tree from a :class:`~hetrain.planner.hierarchy.GroupPlan`."""
    if g is None or g.assignment is None:
        return None
    return Split(g.alpha, g.assignment.types, from_plan(g.left), from_plan(g.right))


def blocks(tree: Split, num_layers: int) -> list[list[list[tuple[int, int]]]]:
    """Per rank (left-first), per layer: [(b0, b1), (i0, i1), (o0, o1)] index ranges."""
    full = [[(0, BATCH), (0, SIZES[i]), (0, SIZES[i + 1])] for i in range(num_layers)]
    out: list = []

    def walk(node, boxes):
        if node is None:
            out.append(boxes)
            return
        left, right = [list(b) for b in boxes], [list(b) for b in boxes]
        for i, t in enumerate(node.types):
            lo, hi = boxes[i][t]
            cut = lo + round(node.alpha * (hi - lo))
            left[i][t], right[i][t] = (lo, cut), (cut, hi)
        walk(node.left, left)
        walk(node.right, right)

    walk(tree, full)
    return out


def cases(world: int) -> list[tuple[str, Split]]:
    """The planned MLP (searched on a small array) plus hand-mixed types so that I, II and III all run."""
    from hetrain.planner.baselines import searched
    from hetrain.planner.devices import parse_array
    from hetrain.planner.hierarchy import plan
    from hetrain.planner.layers import Layer, chain_net

    net = chain_net("verify-mlp", [Layer(f"fc{i}", "linear", a, b, bias=False)
                                   for i, (a, b) in enumerate(zip(SIZES[:-1], SIZES[1:]))])
    spec = "tpu-v3:1,tpu-v2:1" if world == 2 else "tpu-v3:2,tpu-v2:2"
    planned = from_plan(plan(net, BATCH, parse_array(spec), searched("time", 3, 8.0)))
    if world == 2:
        return [("planned " + spec, planned), ("mixed I/II/III", Split(0.5, (0, 1, 2))),
                ("mixed III/II/I ratio 0.7", Split(0.7, (2, 1, 0)))]
    leaf = [Split(0.5, (1, 2, 0)), Split(0.25, (2, 0, 1))]
    return [("planned " + spec, planned), ("mixed two levels", Split(0.5, (0, 1, 2), leaf[0], leaf[1])),
            ("mixed same dim twice", Split(0.6, (1, 1, 2), Split(0.5, (1, 0, 2)), Split(0.5, (1, 2, 2))))]


def _worker(ctx, case_blocks: list) -> list[dict]:
    import torch
    import torch.distributed as dist

    return [_run_case(ctx.rank, per_rank[ctx.rank], torch, dist) for per_rank in case_blocks]


def _run_case(rank, boxes, torch, dist):
    gen = torch.Generator().manual_seed(0)
    ws = [torch.randn(a, b, generator=gen, dtype=torch.float64) / a**0.5 for a, b in zip(SIZES[:-1], SIZES[1:])]
    x = torch.randn(BATCH, SIZES[0], generator=gen, dtype=torch.float64)
    target = torch.randn(BATCH, SIZES[-1], generator=gen, dtype=torch.float64)

    def reduce_block(shape, index, local):
        full = torch.zeros(shape, dtype=torch.float64)
        full[index] = local
        dist.all_reduce(full)
        return full

    acts, pre = [x], []
    for i, w in enumerate(ws):  # forward: each rank multiplies its block only
        (b0, b1), (i0, i1), (o0, o1) = boxes[i]
        local = acts[-1][b0:b1, i0:i1] @ w[i0:i1, o0:o1]
        z = reduce_block((BATCH, w.shape[1]), (slice(b0, b1), slice(o0, o1)), local)
        pre.append(z)
        acts.append(torch.relu(z) if i < len(ws) - 1 else z)
    loss = 0.5 * ((acts[-1] - target) ** 2).sum() / BATCH
    grad_z = (acts[-1] - target) / BATCH
    grads = [None] * len(ws)
    for i in reversed(range(len(ws))):
        (b0, b1), (i0, i1), (o0, o1) = boxes[i]
        g = grad_z[b0:b1, o0:o1]
        grads[i] = reduce_block(ws[i].shape, (slice(i0, i1), slice(o0, o1)), acts[i][b0:b1, i0:i1].T @ g)
        if i:
            grad_x = reduce_block((BATCH, ws[i].shape[0]), (slice(b0, b1), slice(i0, i1)), g @ ws[i][i0:i1, o0:o1].T)
            grad_z = grad_x * (pre[i - 1] > 0)
    ref_ws = [w.clone().requires_grad_(True) for w in ws]
    h = x
    for i, w in enumerate(ref_ws):
        h = h @ w
        h = torch.relu(h) if i < len(ref_ws) - 1 else h
    ref_loss = 0.5 * ((h - target) ** 2).sum() / BATCH
    ref_loss.backward()
    grad_err = max(float((g - w.grad).abs().max()) for g, w in zip(grads, ref_ws))
    return {"loss_err": abs(float(loss - ref_loss.detach())), "grad_err": grad_err}


def verify(world: int, timeout_s: float = 120.0) -> list[VerifyReport]:
    """Run every case of :func:`cases` on ``world`` gloo processes; one report per case."""
    from hetrain.jobs import run_local

    named = cases(world)
    case_blocks = [blocks(tree, len(SIZES) - 1) for _, tree in named]
    if any(len(b) != world for b in case_blocks):
        raise ValueError(f"every case must have {world} leaves")
    start = time.monotonic()
    results = run_local(_worker, world, (case_blocks,), timeout_s=timeout_s, job_timeout_s=timeout_s,
                        stoppable=False)[0]
    seconds = time.monotonic() - start
    return [VerifyReport(name, world, r["loss_err"], r["grad_err"], seconds) for (name, _), r in zip(named, results)]


def verify_all(worlds=(2, 4), timeout_s: float = 120.0) -> list[VerifyReport]:
    return [report for world in worlds for report in verify(world, timeout_s)]
