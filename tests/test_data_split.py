"""What each worker samples: its own shard and the slow workers' (``balanced``, the default), its own shard alone, or
the whole training set (``--data-split whole``)."""

import json

import pytest
import torch
import torch.distributed as dist

from hetrain import data as data_plane
from hetrain.config import RunConfig
from hetrain.data import load_dataset
from hetrain.jobs import checkpoint
from hetrain.jobs.rate_board import RateBoard
from hetrain.jobs.run import run_training
from hetrain.protocols.options import OptionError
from hetrain.shard_balance import shard_mix


def _rows_seen(sampler, data, draws=200):
    """Indices into the training set of every sample ``sampler`` drew (digits rows are distinct)."""
    index = {tuple(row.tolist()): i for i, row in enumerate(data.x_train)}
    return {index[tuple(row.tolist())] for _ in range(draws) for row in sampler.next()[0]}


def test_a_shard_is_its_slice_and_the_whole_split_reaches_every_sample_with_each_workers_own_seed():
    data = load_dataset("mlp")
    n = len(data.x_train)
    shard = _rows_seen(data_plane.make_sampler("mlp", data, 1, 4, 32, 0, split="shard"), data)
    assert shard == set(range(1, n, 4))  # worker 1 of 4: rows 1, 5, 9, ... and no other
    whole = [data_plane.make_sampler("mlp", data, rank, 4, 32, 0, split="whole") for rank in (0, 1)]
    assert _rows_seen(whole[1], data) == set(range(n))  # the whole set, the other workers' rows too
    first = [sampler.next()[1] for sampler in whole]
    assert not torch.equal(first[0], first[1])  # each worker its own order: different data at each step


def test_the_lm_text_is_split_the_same_way():
    data = load_dataset("lm")
    shard = data_plane.make_sampler("lm", data, 1, 4, 2, 0, split="shard")
    whole = data_plane.make_sampler("lm", data, 1, 4, 2, 0, split="whole")
    assert len(shard.tokens) == len(data.x_train) // 4 and len(whole.tokens) == len(data.x_train)


def test_a_checkpoint_resumes_only_with_the_split_it_was_written_with(tmp_path):
    written = RunConfig(num_workers=2, iterations=2, checkpoint_dir=str(tmp_path), data_split="whole")
    (tmp_path / checkpoint.MANIFEST).write_text(json.dumps(checkpoint.fingerprint(written)))
    again = RunConfig(num_workers=2, iterations=2, checkpoint_dir=str(tmp_path), resume=True, data_split="shard")
    with pytest.raises(OptionError, match="written with data_split 'whole', this run has 'shard'"):
        checkpoint.prepare(str(tmp_path), again, resume=True)


# --data-split balanced (the default): hetrain.shard_balance, hetrain.jobs.rate_board

def _shard_rates(rates):
    """Batches per second each shard gets when every worker follows its mix."""
    got = [0.0] * len(rates)
    for rank, rate in enumerate(rates):
        for shard, p in shard_mix(rates, rank).items():
            got[shard] += rate * p
    return got


@pytest.mark.parametrize("rates", [[4, 20, 20, 20, 20, 20, 20, 20], [0, 10, 10, 10], [3, 14, 30, 5, 12, 1]])
def test_every_shard_is_sampled_at_the_fair_rate_when_the_workers_differ_in_speed(rates):
    fair = sum(rates) / len(rates)
    for rank in range(len(rates)):
        assert sum(shard_mix(rates, rank).values()) == pytest.approx(1.0)
        if rates[rank] <= fair:
            assert shard_mix(rates, rank) == {rank: 1.0}  # a worker at or below the fair rate keeps to its shard
    got = _shard_rates(rates)
    assert got == pytest.approx([fair] * len(rates))  # each shard: its owner's share and the gifts, fair in all
    assert sum(got) == pytest.approx(sum(rates))  # nothing drawn twice, nothing lost


def test_at_nearly_equal_speeds_each_worker_keeps_to_its_shard_exactly_as_shard_does():
    rates = [19.5, 20.0, 20.4, 21.0]  # jitter within the dead band
    assert all(shard_mix(rates, rank) == {rank: 1.0} for rank in range(4))
    data = load_dataset("mlp")
    balanced = data_plane.make_sampler("mlp", data, 2, 4, 32, 0, split="balanced")
    balanced.set_rates(rates)
    shard = data_plane.make_sampler("mlp", data, 2, 4, 32, 0, split="shard")
    for _ in range(20):
        assert torch.equal(balanced.next()[0], shard.next()[0])


def test_a_fast_worker_draws_the_slow_workers_shard_in_the_share_the_mix_gives():
    data = load_dataset("mlp")
    n = len(data.x_train)
    fast = data_plane.make_sampler("mlp", data, 1, 4, 8, 0, split="balanced")
    fast.set_rates([5.0, 20.0, 20.0, 20.0])  # fair 16.25: shard 0 is 11.25 short, each fast worker gives 3.75
    assert fast.mix.get(0, 0.0) == pytest.approx(3.75 / 20.0)
    seen = _rows_seen(fast, data, draws=400)
    assert seen <= set(range(0, n, 4)) | set(range(1, n, 4))  # its own rows and the slow worker's, nothing else
    assert fast.drawn[0] / sum(fast.drawn) == pytest.approx(3.75 / 20.0, abs=0.05)
    state = fast.state_dict()
    again = data_plane.make_sampler("mlp", data, 1, 4, 8, 0, split="balanced")
    again.set_rates([5.0, 20.0, 20.0, 20.0])
    again.load_state_dict(state)
    assert all(torch.equal(fast.next()[0], again.next()[0]) for _ in range(30))  # a resume continues the stream


def test_the_rate_board_reads_each_workers_batches_per_second_on_the_readers_clock():
    store = dist.HashStore()
    now = [0.0]
    boards = [RateBoard(store, rank, 2, refresh_s=0.5, window_s=2.0, clock=lambda: now[0]) for rank in range(2)]
    seen = None
    for tick in range(9):  # worker 0 computes 2 batches per tick of 0.5 s, worker 1 ten
        now[0] = tick * 0.5
        boards[1].note(10 * tick)
        seen = boards[0].note(2 * tick) or seen
    assert seen == pytest.approx([4.0, 20.0])


def test_a_rank_with_no_worker_yet_reads_zero_and_counts_once_a_worker_joins_into_it():
    """A job that may grow holds vacant ranks (dead to the others until a worker joins): the live workers'
    rates must not wait for a count that never comes, or the balanced split never covers those shards."""
    store = dist.HashStore()
    now, dead = [0.0], {2}
    boards = [RateBoard(store, rank, 3, refresh_s=0.5, window_s=2.0, clock=lambda: now[0], dead=lambda: dead)
              for rank in range(3)]
    seen = None
    for tick in range(9):
        now[0] = tick * 0.5
        boards[1].note(10 * tick)
        seen = boards[0].note(2 * tick) or seen
    assert seen == pytest.approx([4.0, 20.0, 0.0])
    dead.clear()  # a worker joined rank 2 and counts from 0
    for tick in range(9, 30):
        now[0] = tick * 0.5
        boards[1].note(10 * tick)
        boards[2].note(6 * (tick - 9))
        seen = boards[0].note(2 * tick)
    assert seen == pytest.approx([4.0, 20.0, 12.0])


def test_a_few_batches_give_no_rate_at_all():
    """Steps of seconds (the LM): a count of 3 against 2 would read as a worker 1.5x faster; no rate until the
    fastest has counted enough, so lockstep workers never give their batches away."""
    store = dist.HashStore()
    now = [0.0]
    boards = [RateBoard(store, rank, 2, refresh_s=0.5, window_s=2.0, clock=lambda: now[0]) for rank in range(2)]
    for tick in range(40):  # 20 s; worker 0 one batch every 2 ticks, worker 1 one every 3
        now[0] = tick * 0.5
        boards[1].note(tick // 3)
        assert boards[0].note(tick // 2) is None
    for tick in range(40, 60):
        now[0] = tick * 0.5
        boards[1].note(tick // 3)
        rates = boards[0].note(tick // 2)
    assert rates == pytest.approx([1.0, 2 / 3], rel=0.1)  # once 20 batches are counted: over 20 s or more


def test_a_straggler_s_shard_is_trained_by_the_fast_workers_in_a_real_run(processes, tmp_path):
    config = RunConfig(protocol="hop", num_workers=4, slowdown="0:4x", compute_ms=20, time_budget_s=4.0,
                       data_split="balanced", eval_interval_s=10.0)
    workers = sorted(run_training(config, str(tmp_path), progress=False)["workers"], key=lambda w: w["rank"])
    by_shard = [w["batches_by_shard"] for w in workers]
    assert by_shard[0][1:] == [0, 0, 0]  # the straggler keeps to its own shard
    for rank in (1, 2, 3):
        others = [count for shard, count in enumerate(by_shard[rank]) if shard not in (0, rank)]
        assert by_shard[rank][0] > 0 and others == [0, 0]  # the fast ones give to shard 0 only
    assert sum(row[0] for row in by_shard) > 1.3 * by_shard[0][0]
    for worker in workers:  # every batch counted was trained on (the speed calibration's 4 were counted)
        assert sum(worker["batches_by_shard"]) == worker["iterations"]


def test_the_rate_board_keeps_only_the_counts_its_window_needs():
    store = dist.HashStore()
    now = [0.0]
    board = RateBoard(store, 0, 1, refresh_s=0.5, window_s=2.0, clock=lambda: now[0])
    for tick in range(200):  # 100 s at 20 batches per second
        now[0] = tick * 0.5
        board.note(10 * tick)
    assert len(board._history) <= 6  # the 2 s window and the newest count, not 100 s of counts


_ATTEMPTS = """
import datetime, os, torch.distributed as dist
from hetrain.jobs.rate_board import RateBoard
from hetrain.transport.job import init, job_store
agent = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10))  # outlives attempts
os.environ.update(TORCHELASTIC_USE_AGENT_STORE="True", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(agent.port),
                  RANK="0", WORLD_SIZE="1")
for attempt in ("dead", "restarted"):
    init("gloo", timeout_s=10)  # as a worker under torchrun joins its attempt
    board = RateBoard(job_store(), 0, 1)
    print(attempt, board.store.check(["0"]))
    board.note(500 if attempt == "dead" else 0)
    dist.destroy_process_group()
"""


def test_a_restarted_torchrun_attempt_reads_no_count_of_the_dead_one(processes):
    """Under torchrun's agent store (one store across ``--max-restarts``) each attempt's job store has
    the attempt's own prefix (hetrain.transport.job): the dead attempt's count of 500 is not on the
    restarted attempt's board."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _ATTEMPTS], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["dead", "False", "restarted", "False"]
