"""P-Reduce on 4 gloo workers: known answers, concurrent overlapping groups, cache eviction, timeouts."""

import time

import pytest
import torch

from hetrain.errors import UsageError, WorkerError
from hetrain.groups.preduce import PReduce
from hetrain.jobs.local_job import run_local
from hetrain.protocols.exchange_rule import DIRECT_MAX_BYTES

# Rounds of groups issued concurrently: disjoint within a round, overlapping across rounds,
# and every worker runs its groups in round order (so the calls can never wait in a cycle).
ROUNDS = [
    [(0, 1), (2, 3)],
    [(0, 1, 2, 3)],
    [(1, 2), (0,)],
    [(0, 2, 3)],
    [(0, 1), (2, 3)],
    [(0, 3), (1, 2)],
]


def _expected(num_workers, rounds):
    values = [float(r) * 10 for r in range(num_workers)]
    for groups in rounds:
        for members in groups:
            mean = sum(values[m] for m in members) / len(members)
            for m in members:
                values[m] = mean
    return values


def _known_answer(ctx, cache_size, repeats, direct_max_bytes=DIRECT_MAX_BYTES):
    preduce = PReduce(cache_size=cache_size, timeout_s=ctx.timeout_s, direct_max_bytes=direct_max_bytes)
    buf = torch.full((1000,), float(ctx.rank) * 10) + torch.linspace(0, 1, 1000) / 3
    for _ in range(repeats):
        for groups in ROUNDS:
            for members in groups:
                if ctx.rank in members:
                    preduce(buf, members)
    return buf[0].item(), buf.tolist(), preduce.stats()  # a list: a tensor would travel by a shared fd


@pytest.mark.parametrize("direct_max_bytes", [DIRECT_MAX_BYTES, 0], ids=["direct-exchange", "ring-all-reduce"])
def test_known_answers_with_overlapping_and_disjoint_groups(processes, direct_max_bytes):
    results = run_local(_known_answer, 4, (60, 2, direct_max_bytes), timeout_s=30)
    expected = _expected(4, ROUNDS * 2)
    for rank, (value, buf, stats) in enumerate(results):
        assert value == pytest.approx(expected[rank])
        assert buf[-1] - buf[0] == pytest.approx(1 / 3, abs=1e-5)
        assert stats["cache_evictions"] == 0
        assert stats["cache_hits"] > stats["cache_misses"] > 0
    # the last round is (0, 3) and (1, 2): members of a group end with the same bits
    assert results[0][1] == results[3][1] and results[1][1] == results[2][1]


def test_eviction_with_a_cache_of_one_recreates_communicators_and_stays_correct(processes):
    results = run_local(_known_answer, 4, (1, 2), timeout_s=30)
    expected = _expected(4, ROUNDS * 2)
    for rank, (value, _, stats) in enumerate(results):
        assert value == pytest.approx(expected[rank])
        assert stats["cache_evictions"] > 0
    # worker 0 runs (0,1),(0,1,2,3),(0,2,3),(0,1),(0,3) per repeat: only the repeated (0,1) hits once
    assert results[0][2]["cache_hits"] == 0


def _group_of_one_and_outsider(ctx):
    preduce = PReduce(timeout_s=ctx.timeout_s)
    buf = torch.tensor([float(ctx.rank)])
    preduce(buf, [ctx.rank])
    try:
        preduce(buf, [(ctx.rank + 1) % ctx.world_size])
        message = ""
    except UsageError as exc:
        message = str(exc)
    preduce(torch.zeros(1), range(ctx.world_size))  # nobody exits while the other still connects
    return buf.item(), message


def test_group_of_one_is_a_no_op_and_outsiders_are_refused(processes):
    for rank, (value, message) in enumerate(run_local(_group_of_one_and_outsider, 2, timeout_s=20)):
        assert value == rank
        assert "not in" in message


def _rank_two_never_arrives(ctx, warm):
    preduce = PReduce(timeout_s=ctx.timeout_s)
    buf = torch.ones(10)
    if warm:  # communicator cached first: the failure happens in the collective, not the creation
        preduce(buf, (0, 1, 2))
    if ctx.rank == 2:
        time.sleep(30)
    preduce(buf, (0, 1, 2))


@pytest.mark.parametrize("warm", [pytest.param(False, marks=pytest.mark.slow), True])  # CI time: each waits a timeout out
def test_a_missing_member_fails_the_call_naming_group_and_rank(processes, warm):
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        run_local(_rank_two_never_arrives, 3, (warm,), timeout_s=2)
    message = str(info.value)
    assert "group [0, 1, 2]" in message and "did not arrive: [2]" in message
    assert time.monotonic() - start < 25
