"""Multi-process known-answer tests of the runtime protocols on gloo (rank-valued tensors).

Assertions are made on the models *before* ``finish()`` (which averages every
worker's model and would hide a protocol that never mixed), and stragglers are
made deterministic: a slow worker waits for an event (its neighbours' updates
being far enough ahead), not for a sleep to be long enough.
"""

import os
import time

import pytest
import torch
from torch import nn

from hetrain.errors import WorkerError
from hetrain.jobs.local_job import run_local
from hetrain.runtime.allreduce import AllReduce
from hetrain.runtime.hop import DPSGD, Hop


def _rank_model(rank: int) -> nn.Module:
    model = nn.Linear(1, 1, bias=False).double()
    with torch.no_grad():
        model.weight.fill_(float(rank))
    return model


def _one_sync(ctx, protocol):
    model = _rank_model(ctx.rank)
    sync = DPSGD(model) if protocol == "dpsgd" else Hop(model, backup=0, staleness=0, max_ig=2, skip_threshold=0)
    sync.step()  # one averaging with the ring neighbours, no gradient
    after_one = model.weight.item()
    sync.finish()
    return after_one, model.weight.item(), sync.metrics()


@pytest.mark.parametrize("protocol", ["dpsgd", "hop"])
@pytest.mark.contract
def test_ring_average_known_answer(processes, protocol):
    n = 4
    results = run_local(_one_sync, n, (protocol,), timeout_s=30)
    for rank, (after_one, final, metrics) in enumerate(results):
        expected = (rank + (rank - 1) % n + (rank + 1) % n) / 3  # ring weights are 1/3 each
        assert after_one == pytest.approx(expected, abs=1e-12)
        assert final == pytest.approx(sum(range(n)) / n, abs=1e-12)  # finish() leaves the consensus
        assert metrics["iterations"] == 1 and metrics["updates_stale"] == 0
    assert results[0][2]["consensus_distance"] > 0


def _averaging_only(ctx, protocol, steps):
    """``steps`` synchronisations with no gradient; the model just before finish() is returned."""
    model = _rank_model(ctx.rank)
    make = {"dpsgd": lambda: DPSGD(model),
            "hop-b0": lambda: Hop(model, backup=0, staleness=0, skip_threshold=0, max_ig=4)}[protocol]
    with make() as sync:
        while not sync.should_stop(local_done=sync.stats.iteration >= steps):
            sync.step()
        before_finish = model.weight.item()
    return before_finish, sync.metrics()


@pytest.mark.parametrize("protocol", ["dpsgd", "hop-b0"])
def test_averaging_preserves_the_mean_and_contracts_before_finish(processes, protocol):
    """Symmetric doubly-stochastic mixing with every update used (no backup worker, no staleness): the mean
    of the models stays exactly the initial mean, and the spread shrinks by the ring's mixing rate."""
    n, steps = 4, 12
    results = run_local(_averaging_only, n, (protocol, steps), timeout_s=30)
    models = [m for m, _ in results]
    assert sum(models) / n == pytest.approx(sum(range(n)) / n, abs=1e-9)
    spread = max(models) - min(models)
    # the 4-ring with weights 1/3 contracts the disagreement by 1/3 per step: 3 * (1/3)^12 ~ 6e-6
    assert spread < 1e-4 < n - 1
    assert all(m["iteration"] >= steps and m["updates_stale"] == 0 for _, m in results)


def _straggler(ctx, steps):
    """Worker 0 is slow deterministically: before each step it waits until every in-neighbour's newest
    update is at least the skip threshold (2) ahead of its own iteration, or the neighbour has stopped."""
    model = _rank_model(ctx.rank)
    with Hop(model, backup=1, staleness=1, max_ig=4, skip_threshold=2) as sync:
        logic = sync.logic

        def neighbours_far_ahead() -> bool:
            return all((q and q[-1][0] >= logic.iteration + 2) or j in logic.finished_senders
                       for j, q in logic.queues.items())

        while not sync.should_stop(local_done=sync.stats.iteration >= steps):
            if ctx.rank == 0:
                with sync._cond:
                    sync._cond.wait_for(neighbours_far_ahead, timeout=20)
            sync.step()
        before_finish = model.weight.item()
    return before_finish, sync.metrics()


def test_hop_straggler_skips_and_fast_workers_do_not_wait_for_it(processes):
    results = run_local(_straggler, 4, (40,), timeout_s=30)
    slow, fast = results[0][1], [m for _, m in results[1:]]
    assert slow["skipped_iterations"] > 0
    assert slow["iterations"] + slow["skipped_iterations"] == slow["iteration"] >= 40
    assert slow["iterations"] < min(m["iterations"] for m in fast)
    assert all(m["iterations"] == m["iteration"] for m in fast)  # fast workers never skip
    models = [m for m, _ in results]
    # mixed before finish: they started 3 apart (0..3) and take no gradients, so only averaging moves
    # them; 40 iterations of it leave ~1e-11 (measured), and a worker that never mixed would leave 3
    assert max(models) - min(models) < 0.01


def _ddp_gradient(ctx):
    model = _rank_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    sync = AllReduce(model, optimizer)  # the optimizer's step post-hook calls sync.step()
    x = torch.tensor([[float(ctx.rank)]], dtype=torch.float64)
    sync.should_stop(False)
    sync.module(x).sum().backward()  # d/dw (w * rank) = rank, averaged by DDP
    grad = model.weight.grad.item()
    optimizer.step()
    while not sync.should_stop(local_done=ctx.rank == 2):  # one worker's wish stops all, together
        optimizer.zero_grad()
        sync.module(x).sum().backward()
        optimizer.step()
    sync.finish()
    return grad, sync.stats.iterations


@pytest.mark.contract
def test_allreduce_is_ddp_and_workers_agree_to_stop(processes):
    from hetrain.runtime.allreduce import STOP_CHECK_EVERY

    results = run_local(_ddp_gradient, 4, timeout_s=30)
    assert all(grad == pytest.approx(1.5) for grad, _ in results)
    assert [iterations for _, iterations in results] == [STOP_CHECK_EVERY] * 4


def _stall(ctx):
    model = _rank_model(ctx.rank)
    sync = DPSGD(model, timeout_s=ctx.timeout_s)
    if ctx.rank == 2:
        time.sleep(30)  # stalls: never sends its model
    sync.step()
    return 0


def test_a_stalled_worker_fails_the_job_naming_what_was_awaited(processes):
    began = time.monotonic()
    with pytest.raises(WorkerError) as info:
        run_local(_stall, 3, timeout_s=2)
    assert time.monotonic() - began < 25
    assert "waited" in str(info.value) and "worker(s) [2]" in str(info.value)


def _die(ctx):
    model = _rank_model(ctx.rank)
    sync = DPSGD(model)
    if ctx.rank == 1:
        os._exit(3)
    sync.step()
    sync.finish()
    return 0


def test_a_dead_worker_fails_the_job_quickly(processes):
    began = time.monotonic()
    with pytest.raises(WorkerError, match="worker 1 exited with code 3"):
        run_local(_die, 3, timeout_s=20)
    assert time.monotonic() - began < 15
