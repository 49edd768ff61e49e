"""Worker functions of the no-gradient consensus checks (issue 36), shared by
``tests/runtime/test_outer_consensus.py`` and ``benchmarks/consensus_checks.py``: each starts every
worker elsewhere, takes no gradient step, and returns (start, model before finish[, its steps])."""

from __future__ import annotations

import time

import torch

import hetrain

NESTEROV = {"lr": 0.7, "momentum": 0.9, "nesterov": True}
AUTO_STEPS = {0: 2, 3: 5}  # local steps per exchange by rank under local_work="auto"; the others take 8
STEP_S = {0: 4.0, 3: 1.6}  # the step times that give them: round(8 * 1.0 / 4.0) = 2, round(8 / 1.6) = 5


def start_model(rank: int, size: int = 8) -> torch.nn.Module:
    model = torch.nn.Module()
    start = torch.randn(size, generator=torch.Generator().manual_seed(100 + rank), dtype=torch.float64) + 3.0 * rank
    model.w = torch.nn.Parameter(start)
    return model


def gossip_only(ctx, topology: str, exchanges: int, outer: bool, until_groups: bool = False):
    """``sync_every=1``, with outer Nesterov or none; ``topology`` "prague": Prague's groups of two.

    ``until_groups`` (Prague): step until every worker has been in ``exchanges`` groups (each reads the
    others' counts from the job's store after each step), not for ``exchanges`` steps: under load a worker finds
    no partner at more of its steps, and a fixed count of steps then mixed too little for the test's
    bound (2 of 9 loaded runs), while more steps let the mutant it must catch pass (150: 0.04 falls
    below 1e-4). A worker at its count keeps stepping, a partner for the others, until all are."""
    model = start_model(ctx.rank)
    start = model.w.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), **NESTEROV) if outer else None
    if topology == "prague":  # groups of two, a new partner every exchange (the smart Group Generator)
        # no overlap: with it, a pair's last average lands on whichever member steps again (a member that
        # already took its last step holds it until finish), so the mean before finish moves under load
        sync = hetrain.Prague(model, None, group_size=2, sync_every=1, outer_optimizer=optimizer or "none", preduce_overlap=0)
    else:
        sync = hetrain.DPSGD(model, None, topology=topology, sync_every=1, outer_optimizer=optimizer or "none")
    steps = 0
    while True:
        if topology == "prague":
            time.sleep(0.005)  # a step's compute: workers that sprint find no partner and form no group
        sync.step()  # no gradient: the model changes only by the exchange (and the outer step)
        steps += 1
        if not (until_groups and topology == "prague"):
            if steps >= exchanges:
                break
            continue
        fewest = _fewest_groups(ctx, sync.metrics()["groups_formed"])
        if fewest >= exchanges:
            break
        if steps >= 20 * exchanges:
            raise AssertionError(f"worker {ctx.rank}: a worker was in {fewest} groups after {steps} steps")
    before = model.w.detach().clone()
    sync.finish()
    return start.numpy(), before.numpy()


def _fewest_groups(ctx, mine: int) -> int:
    """Publish this worker's groups so far in the job's store; the fewest any worker has published (0 for
    one that has not yet). Through the store, not a collective: a collective between steps deadlocked
    against the group averages (a worker in one waits for a partner that waits in the other)."""
    from torch.distributed.distributed_c10d import _get_default_store

    store = _get_default_store()
    store.set(f"consensus-groups/{ctx.rank}", str(mine))
    keys = [f"consensus-groups/{rank}" for rank in range(ctx.world_size)]
    if not store.check(keys):
        return 0
    return min(int(store.get(key)) for key in keys)


def auto_gossip(ctx, topology: str, exchanges: int):
    """``local_work="auto"`` with a fixed step time per rank (STEP_S): the runtime's own sizing gives the
    steps of AUTO_STEPS, and every worker's speed board holds every step time before the first exchange."""
    model = start_model(ctx.rank)
    if topology == "prague":  # random groups of two, each a P-Reduce weighted by steps
        sync = hetrain.Prague(model, None, group_size=2, sync_every=8, local_work="auto", preduce_overlap=0)
    else:
        sync = hetrain.DPSGD(model, None, topology=topology, sync_every=8, local_work="auto")
    step_s = STEP_S.get(ctx.rank, 1.0)
    sync._step_timer.step_s = step_s
    sync._step_timer.add = lambda seconds: None  # a fixed speed per worker, whatever the steps take here
    sync._speeds.publish(step_s)
    keys = [str(r) for r in range(ctx.world_size)]
    deadline = time.monotonic() + 30
    while not sync._speeds.store.check(keys):  # the same board on every worker from the first exchange
        if time.monotonic() > deadline:
            raise TimeoutError(f"worker {ctx.rank} waited 30 s for every step time on the speed board")
        time.sleep(0.01)
    steps = sync._next_local_steps()
    assert steps == AUTO_STEPS.get(ctx.rank, 8), steps
    sync._steps_this_exchange = steps  # the first exchange too (it would take sync_every: nothing measured)
    start = model.w.detach().clone()
    for _ in range(exchanges * steps):
        sync.step()
    before = model.w.detach().clone()
    sync.finish()
    return start.numpy(), before.numpy(), steps


def momentum_after_progress(ctx, protocol: str, compression: str, exchanges: int):
    """Outer Nesterov on a ring, ``sync_every=2``: 10 exchanges of progress toward each worker's own
    target (its momentum then its own), then ``exchanges`` with none. Returns the outer momentum before
    finish and the bytes of one update message."""
    model = start_model(ctx.rank)
    target = torch.full_like(model.w, 10.0 * (ctx.rank - 3.5))
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    outer = torch.optim.SGD(model.parameters(), **NESTEROV)
    options = {"backup": 0, "staleness": 0, "skip_threshold": 0, "max_ig": 2} if protocol == "hop" else {}
    cls = hetrain.Hop if protocol == "hop" else hetrain.DPSGD
    sync = cls(model, inner, topology="ring", sync_every=2, outer_optimizer=outer, compression=compression, **options)
    for step in range(2 * (10 + exchanges)):
        if step == 20:
            inner.param_groups[0]["lr"] = 0.0  # no progress from here on: only the exchanges move anything
        inner.zero_grad()
        ((model.w - target) ** 2).sum().backward()
        inner.step()
    momentum = outer.state[model.w]["momentum_buffer"].detach().clone()
    nbytes = sync._public.codec.payload_nbytes if sync._public is not None else sync.state.nbytes
    sync.finish()
    return momentum.numpy(), nbytes
