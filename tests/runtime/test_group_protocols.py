"""End-to-end prague / adpsgd / ps on 4 gloo workers with a tiny model and a small training loop.

Workers start from different models and run different numbers of
iterations, so they leave the loop at different times. While they train (at
step 35, before ``finish()``, which averages everyone and would hide a
protocol that never mixed) the workers' models must be much closer together
than four workers training alone are; after ``finish()`` they must agree and
be accurate on held-out data.
"""

import time

import pytest
import torch
from torch import nn

from hetrain.config import RunConfig
from hetrain.jobs.local_job import run_local
from hetrain.registry import get_spec

ITERATIONS = [40, 60, 50, 70]
PROBE = 35  # every worker's model after this many steps (all still training) measures the mixing


def _task(seed):
    gen = torch.Generator().manual_seed(seed)
    weights = torch.randn(8, generator=gen)
    x = torch.randn(1200, 8, generator=gen)
    y = (x @ weights > 0).long()
    return x, y


def _train(ctx, config: RunConfig | None, iterations: list[int], start_after_left: tuple = (), rank=None,
           same_start: bool = False):
    """One worker's loop; ``config`` None trains alone (no protocol): the no-communication baseline."""
    rank = ctx.rank if ctx is not None else rank
    torch.manual_seed(0 if same_start else rank)  # workers start far apart: mixing must bring them together
    model = nn.Linear(8, 2)
    with torch.no_grad():
        model.weight.mul_(10.0)
    x, y = _task(1)
    x_train, y_train, x_test, y_test = x[:1000], y[:1000], x[1000:], y[1000:]
    shard = torch.arange(rank, 1000, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sync = None
    if config is not None:
        sync = get_spec(config.protocol).build(model, opt, config.protocol_options(), seed=config.seed,
                                               timeout_s=ctx.timeout_s)  # the optimizer hook syncs
    gen = torch.Generator().manual_seed(rank)
    if ctx is not None and not start_after_left:
        torch.distributed.barrier()  # start together: how far apart the processes start up is the machine's load
    if start_after_left and rank not in start_after_left:
        while not set(start_after_left) <= set(sync.gg.status()["left"]):
            time.sleep(0.01)  # hold this worker back until the named workers have left the GG
    probe, step = None, 0
    while not (sync.should_stop(local_done=step >= iterations[rank]) if sync else step >= iterations[rank]):
        idx = shard[torch.randint(len(shard), (16,), generator=gen)]
        loss = nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step == PROBE:
            probe = torch.nn.utils.parameters_to_vector(model.parameters()).tolist()  # no tensors via queues
    if sync is not None:
        sync.finish()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).tolist()
    return flat, accuracy, sync.metrics() if sync else {}, probe


def _spread(models) -> float:
    stacked = torch.tensor(models)
    return float((stacked - stacked.mean(0)).norm(dim=1).pow(2).mean().sqrt())


ALONE_SPREAD = _spread([_train(None, None, ITERATIONS, rank=r)[3] for r in range(4)])
# the parameter server starts every worker from rank 0's model: its baseline is workers that start
# from one model and then train alone (their batches differ)
ALONE_SPREAD_SAME_START = _spread([_train(None, None, ITERATIONS, rank=r, same_start=True)[3] for r in range(4)])


CASES = [
    ("prague", {"gg": "smart", "group_size": 3}),
    pytest.param("prague", {"gg": "random", "group_size": 2}, marks=pytest.mark.contract),
    ("prague", {"gg": "smart", "group_size": 2, "gg_prefetch_ms": 0.0}),  # ask after the compute
    ("prague", {"gg": "smart", "group_size": 2, "preduce_overlap": 0}),  # block on P-Reduce
    # sharded: under -m slow. It formed no group at all in 4 of 6 tries (4 fast workers, 2 shards): a
    # shard's generator groups only workers that arrived in its epoch, and with ~1 ms steps a worker could
    # finish before its shard partner's process had started. The workers now start together (a barrier
    # in _train); 4 of 4 tries passed after that (2026-12-01)
    pytest.param("prague", {"gg": "random", "group_size": 2, "gg_shards": 2, "gg_epoch_s": 0.05},
                 marks=pytest.mark.slow),
    ("prague", {"gg": "buffer", "group_size": 3}),
    ("prague", {"gg": "division", "group_size": 2, "communicator_cache": 1}),
    ("prague", {"gg": "static", "group_size": 2, "workers_per_node": 2}),
    ("adpsgd", {}),
    ("ps", {"staleness": 0}),
    ("ps", {"staleness": 2}),
]


@pytest.mark.parametrize("protocol, options", CASES,
                         ids=[f"{p}-{o}" for p, o in (getattr(c, "values", c) for c in CASES)])
def test_four_workers_mix_before_finish_and_end_in_consensus(processes, protocol, options):
    config = RunConfig(protocol=protocol, num_workers=4, iterations=60, options=options).validate()
    results = run_local(_train, 4, (config, ITERATIONS), timeout_s=30, job_timeout_s=150)
    spread = _spread([r[3] for r in results])
    if not options.get("gg_shards"):
        # (sharded: whether 35 fast steps, about 1 ms each, overlap a shard partner's in the first 0.05 s
        # epochs is timing; seen mixing nothing by then, and 3.10 against 2.23. Their mixing is checked
        # by the property and simulator tests; here, that they end in consensus.)
        alone = ALONE_SPREAD_SAME_START if protocol == "ps" else ALONE_SPREAD
        assert spread < 0.5 * alone, (spread, alone)  # they mixed while training
    first = results[0][0]
    for flat, accuracy, metrics, _ in results:
        assert flat == pytest.approx(first, abs=1e-5)
        assert accuracy >= 0.9
        assert metrics["iterations"] >= 40
    if protocol == "adpsgd":
        # A passive worker never waits for anyone, so nothing stops it from running
        # all its iterations (and leaving) before an active worker first asks for a
        # pair; on a loaded machine that happens. Which workers get paired is
        # therefore timing, not correctness (see the test below). What always holds:
        # every pair handed out was run by both its members, one active and one passive.
        _assert_pairs_accounted(results)
    elif protocol != "ps":
        assert sum(m["groups_formed"] for _, _, m, _ in results) > 0
        assert all(m["cache_misses"] >= 1 for _, _, m, _ in results)
        assert options.get("gg") == "static" or "gg_groups_formed" in results[0][2]


def _assert_pairs_accounted(results):
    metrics = [m for _, _, m, _ in results]
    roles = [m["role"] for m in metrics]
    assert roles == ["active", "passive", "active", "passive"]
    active = sum(m["groups_formed"] for m in metrics if m["role"] == "active")
    passive = sum(m["groups_formed"] for m in metrics if m["role"] == "passive")
    assert active == passive == metrics[0]["gg_groups_formed"]  # rank 0 hosts the pairing
    for m in metrics:
        assert m["cache_hits"] + m["cache_misses"] == m["groups_formed"]
        assert (m["cache_misses"] >= 1) == (m["groups_formed"] >= 1)  # a set's first pair creates it
        assert m["mean_group_size"] == (2.0 if m["groups_formed"] else 0.0)


def test_adpsgd_passives_that_leave_before_any_active_asks_are_never_paired_and_still_end_in_consensus(processes):
    """The schedule a loaded machine produced by chance, forced: passives 1 and 3 run and leave first."""
    config = RunConfig(protocol="adpsgd", num_workers=4, iterations=60).validate()
    results = run_local(_train, 4, (config, ITERATIONS, (1, 3)), timeout_s=30, job_timeout_s=150)
    first = results[0][0]
    for flat, accuracy, metrics, _ in results:
        assert flat == pytest.approx(first, abs=1e-5)
        assert accuracy >= 0.9
        assert metrics["groups_formed"] == metrics["cache_misses"] == 0  # a passive that left is never picked
        assert metrics["empty_syncs"] == metrics["iterations"]
    assert results[0][2]["gg_groups_formed"] == 0
    _assert_pairs_accounted(results)
