"""Multi-process known-answer tests of the runtime protocols on gloo (rank-valued tensors)."""

import os
import time

import pytest
import torch
from torch import nn

from hetrain.errors import WorkerError
from hetrain.runtime.allreduce import AllReduce
from hetrain.runtime.hop import DPSGD, Hop
from hetrain.runtime.local_job import run_local


def _rank_model(rank: int) -> nn.Module:
    model = nn.Linear(1, 1, bias=False).double()
    with torch.no_grad():
        model.weight.fill_(float(rank))
    return model


def _one_sync(ctx, protocol):
    model = _rank_model(ctx.rank)
    sync = DPSGD(model, ctx) if protocol == "dpsgd" else Hop(model, ctx, backup=0, staleness=0, max_ig=2,
                                                             skip_threshold=0)
    sync.should_stop(False)
    sync.step()  # one averaging with the ring neighbours, no gradient
    after_one = model.weight.item()
    sync.finish()
    return after_one, model.weight.item(), sync.metrics()


@pytest.mark.parametrize("protocol", ["dpsgd", "hop"])
def test_ring_average_known_answer(protocol):
    n = 4
    results = run_local(_one_sync, n, (protocol,), timeout_s=30)
    for rank, (after_one, final, metrics) in enumerate(results):
        expected = (rank + (rank - 1) % n + (rank + 1) % n) / 3  # ring weights are 1/3 each
        assert after_one == pytest.approx(expected, abs=1e-12)
        assert final == pytest.approx(sum(range(n)) / n, abs=1e-12)  # finish() leaves the consensus
        assert metrics["iterations"] == 1 and metrics["updates_stale"] == 0
    assert results[0][2]["consensus_distance"] > 0


def _many_steps(ctx, protocol, steps, slow_rank):
    model = _rank_model(ctx.rank)
    sync = {"dpsgd": lambda: DPSGD(model, ctx),
            "hop": lambda: Hop(model, ctx, backup=1, staleness=1, max_ig=4, skip_threshold=2)}[protocol]()
    step = 0
    while not sync.should_stop(local_done=sync.stats.iteration >= steps):
        if ctx.rank == slow_rank:
            time.sleep(0.02)
        sync.step()
        step += 1
    sync.finish()
    return model.weight.item(), sync.metrics()


@pytest.mark.parametrize("protocol", ["dpsgd", "hop"])
def test_mean_is_preserved_and_workers_agree(protocol):
    """Averaging without gradients keeps the mean (doubly stochastic weights, or renormalised ones that
    finish() repairs) and every worker ends on the same model."""
    results = run_local(_many_steps, 4, (protocol, 30, 0), timeout_s=30)
    finals = [r[0] for r in results]
    assert max(finals) - min(finals) < 1e-12
    if protocol == "dpsgd":
        assert finals[0] == pytest.approx(1.5, abs=1e-9)
    for _, metrics in results:
        assert metrics["iteration"] >= 30


def test_hop_straggler_skips_and_fast_workers_do_not_wait_for_it():
    results = run_local(_many_steps, 4, ("hop", 40, 0), timeout_s=30)
    slow, fast = results[0][1], [m for _, m in results[1:]]
    assert slow["skipped_iterations"] > 0
    assert slow["iterations"] + slow["skipped_iterations"] == slow["iteration"] >= 40
    assert slow["iterations"] < min(m["iterations"] for m in fast)
    assert all(m["iterations"] == m["iteration"] for m in fast)  # fast workers never skip


def _ddp_gradient(ctx):
    model = _rank_model(0)
    sync = AllReduce(model, ctx)
    x = torch.tensor([[float(ctx.rank)]], dtype=torch.float64)
    sync.should_stop(False)
    sync.module(x).sum().backward()  # d/dw (w * rank) = rank, averaged by DDP
    grad = model.weight.grad.item()
    sync.step()
    while not sync.should_stop(local_done=ctx.rank == 2):  # one worker's wish stops all, together
        sync.module(x).sum().backward()
        sync.step()
    sync.finish()
    return grad, sync.stats.iterations


def test_allreduce_is_ddp_and_workers_agree_to_stop():
    from hetrain.runtime.allreduce import STOP_CHECK_EVERY

    results = run_local(_ddp_gradient, 4, timeout_s=30)
    assert all(grad == pytest.approx(1.5) for grad, _ in results)
    assert [iterations for _, iterations in results] == [STOP_CHECK_EVERY] * 4


def _stall(ctx):
    model = _rank_model(ctx.rank)
    sync = DPSGD(model, ctx)
    sync.should_stop(False)
    if ctx.rank == 2:
        time.sleep(30)  # stalls: never sends its model
    sync.step()
    return 0


def test_a_stalled_worker_fails_the_job_naming_what_was_awaited():
    began = time.monotonic()
    with pytest.raises(WorkerError) as info:
        run_local(_stall, 3, timeout_s=2)
    assert time.monotonic() - began < 25
    assert "waited" in str(info.value) and "worker(s) [2]" in str(info.value)


def _die(ctx):
    model = _rank_model(ctx.rank)
    sync = DPSGD(model, ctx)
    sync.should_stop(False)
    if ctx.rank == 1:
        os._exit(3)
    sync.step()
    sync.finish()
    return 0


def test_a_dead_worker_fails_the_job_quickly():
    began = time.monotonic()
    with pytest.raises(WorkerError, match="worker 1 exited with code 3"):
        run_local(_die, 3, timeout_s=20)
    assert time.monotonic() - began < 15
