"""Worker functions of the no-gradient consensus checks (issue 36), shared by
``tests/runtime/test_outer_consensus.py`` and ``benchmarks/consensus_checks.py``: each starts every
worker elsewhere, takes no gradient step, and returns (start, model before finish[, its steps])."""

from __future__ import annotations

import time

import torch

import hetrain

NESTEROV = {"lr": 0.7, "momentum": 0.9, "nesterov": True}
AUTO_STEPS = {0: 2, 3: 5}  # local steps per exchange by rank under local_work="auto"; the others take 8


def start_model(rank: int, size: int = 8) -> torch.nn.Module:
    model = torch.nn.Module()
    start = torch.randn(size, generator=torch.Generator().manual_seed(100 + rank), dtype=torch.float64) + 3.0 * rank
    model.w = torch.nn.Parameter(start)
    return model


def gossip_only(ctx, topology: str, exchanges: int, outer: bool):
    """``sync_every=1``, with outer Nesterov or none; ``topology`` "prague": Prague's groups of two."""
    model = start_model(ctx.rank)
    start = model.w.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), **NESTEROV) if outer else None
    if topology == "prague":  # groups of two, a new partner every exchange (the smart Group Generator)
        # no overlap: with it, a pair's last average lands on whichever member steps again (a member that
        # already took its last step holds it until finish), so the mean before finish moves under load
        sync = hetrain.Prague(model, None, group_size=2, sync_every=1, outer_optimizer=optimizer, preduce_overlap=0)
    else:
        sync = hetrain.DPSGD(model, None, topology=topology, sync_every=1, outer_optimizer=optimizer)
    for _ in range(exchanges):
        if topology == "prague":
            time.sleep(0.005)  # a step's compute: workers that sprint find no partner and form no group
        sync.step()  # no gradient: the model changes only by the exchange (and the outer step)
    before = model.w.detach().clone()
    sync.finish()
    return start.numpy(), before.numpy()


def auto_gossip(ctx, topology: str, exchanges: int):
    """``local_work="auto"`` with a fixed number of local steps per rank (AUTO_STEPS)."""
    import hetrain.runtime.protocol as protocol_module

    steps = AUTO_STEPS.get(ctx.rank, 8)
    protocol_module.steps_per_exchange = lambda sync_every, own, fastest: steps  # a fixed speed per worker
    model = start_model(ctx.rank)
    if topology == "prague":  # random groups of two, each a P-Reduce weighted by steps
        sync = hetrain.Prague(model, None, group_size=2, sync_every=8, local_work="auto", preduce_overlap=0)
    else:
        sync = hetrain.DPSGD(model, None, topology=topology, sync_every=8, local_work="auto")
    sync._steps_this_exchange = steps  # the first exchange too (it would take sync_every: nothing measured)
    start = model.w.detach().clone()
    for _ in range(exchanges * steps):
        sync.step()
    before = model.w.detach().clone()
    sync.finish()
    return start.numpy(), before.numpy(), steps
