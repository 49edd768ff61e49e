"""End-to-end prague / adpsgd / ps on 4 gloo workers with a tiny model and a small training loop.

Workers run different numbers of iterations (and worker 0 is slower), so they
leave the loop at different times; every run must end with all workers holding
the same model, accurate on held-out data.
"""

import time

import pytest
import torch
from torch import nn

from hetrain.config import RunConfig
from hetrain.runtime.local_job import run_local
from hetrain.runtime.registry import protocol_class


def _task(seed):
    gen = torch.Generator().manual_seed(seed)
    weights = torch.randn(8, generator=gen)
    x = torch.randn(1200, 8, generator=gen)
    y = (x @ weights > 0).long()
    return x, y


def _train(ctx, config: RunConfig, iterations: list[int], slow_s: float):
    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    x, y = _task(1)
    x_train, y_train, x_test, y_test = x[:1000], y[:1000], x[1000:], y[1000:]
    shard = torch.arange(ctx.rank, 1000, ctx.world_size)
    opt = torch.optim.SGD(model.parameters(), lr=config.lr)
    sync = protocol_class(config.protocol).from_config(model, ctx, config)
    gen = torch.Generator().manual_seed(ctx.rank)
    it = 0
    while not sync.should_stop(local_done=it >= iterations[ctx.rank]):
        idx = shard[torch.randint(len(shard), (config.batch_size,), generator=gen)]
        loss = nn.functional.cross_entropy(sync.module(x_train[idx]), y_train[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if ctx.rank == 0 and slow_s:
            time.sleep(slow_s)
        sync.step()
        it += 1
    sync.finish()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).tolist()
    return flat, accuracy, sync.metrics()


CASES = [
    ("prague", {"gg": "smart", "group_size": 3}),
    ("prague", {"gg": "random", "group_size": 2}),
    ("prague", {"gg": "buffer", "group_size": 3}),
    ("prague", {"gg": "division", "group_size": 2, "communicator_cache": 1}),
    ("prague", {"gg": "static", "group_size": 2, "workers_per_node": 2}),
    ("adpsgd", {}),
    ("ps", {"staleness": 0}),
    ("ps", {"staleness": 2}),
]


@pytest.mark.parametrize("protocol, options", CASES, ids=[f"{p}-{o}" for p, o in CASES])
def test_four_workers_leave_at_different_iterations_and_end_in_consensus(protocol, options):
    config = RunConfig(protocol=protocol, num_workers=4, iterations=60, lr=0.5, batch_size=16, **options)
    config.validate()
    results = run_local(_train, 4, (config, [40, 60, 50, 70], 0.002), timeout_s=30, job_timeout_s=150)
    first = results[0][0]
    for flat, accuracy, metrics in results:
        assert flat == pytest.approx(first, abs=1e-5)
        assert accuracy >= 0.9
        assert metrics["iterations"] >= 40
    if protocol != "ps":
        assert sum(m["groups_formed"] for _, _, m in results) > 0
        assert all(m["cache_misses"] >= 1 for _, _, m in results)
        assert options.get("gg") == "static" or "gg_groups_formed" in results[0][2]
