"""The fast tier: each protocol's wiring, membership changes and compression on ranks that are threads
of the test process (hetrain.testing.thread_ranks: real gloo groups and messages on one store, no
processes, no default process group). Workers start from different models, so a test passes only if
they communicate (the no-communication mutant fails them: tests/mutants/test_mutants.py)."""

import threading
import time

import pytest
import torch
import torch.distributed as dist

import hetrain
from hetrain.testing.thread_ranks import SharedMembership, run_threads
from hetrain.transport.worker_transport import Transport

pytestmark = pytest.mark.usefixtures("loopback")  # thread-ranks: real gloo groups over loopback

MAKERS = {
    "dpsgd": lambda model, t, **kw: hetrain.DPSGD(model, None, topology="ring", transport=t, **kw),
    "hop": lambda model, t, **kw: hetrain.Hop(model, None, topology="ring", transport=t, **kw),
    "prague": lambda model, t, **kw: hetrain.Prague(model, None, group_size=2, gg="random", preduce_overlap=0,
                                                    transport=t, **kw),
    "adpsgd": lambda model, t, **kw: hetrain.ADPSGD(model, None, transport=t, **kw),
    "ps": lambda model, t, **kw: hetrain.ParameterServer(model, None, transport=t, **kw),
}
KEEP_THE_MEAN = ("dpsgd", "prague", "adpsgd")  # symmetric mixing (Hop's backup workers and staleness do not)


def _model(rank: int) -> torch.nn.Module:
    model = torch.nn.Linear(6, 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(torch.randn(1, 6, generator=torch.Generator().manual_seed(rank), dtype=torch.float64)
                           + 2.0 * rank)
    return model


def _gossip(rank, protocol: str, steps: int, settings: dict, min_groups: int = 0, board: list | None = None,
            line: threading.Barrier | None = None):
    """``steps`` steps, then on until every worker took part in ``min_groups`` groups (Prague, AD-PSGD: a
    condition, not a count of steps, since a loaded machine forms fewer groups in as many steps; every
    worker, since AD-PSGD's passive workers never wait: left to their own count they may finish before a
    late active one joined a group). ``board``: each worker's groups so far; ``line``: the start, together
    (a rank whose thread started late would find the others done)."""
    model = _model(rank.rank)
    start = model.weight.detach().clone()
    sync = MAKERS[protocol](model, rank.transport(protocol), **settings)
    board = board if board is not None else [0]
    if line is not None:
        line.wait(30)
    taken = 0
    while taken < steps or (min(board) < min_groups and taken < 50 * steps):
        time.sleep(0.002)  # a step's compute: Prague's and AD-PSGD's groups form as workers arrive
        sync.step()  # no gradient: the model moves only by communication
        taken += 1
        if rank.rank < len(board):
            board[rank.rank] = sync.metrics().get("groups_formed", 0)
    before = model.weight.detach().clone()
    sync.finish()
    return start, before, model.weight.detach().clone(), dist.is_initialized()


def _stack(results, index):
    return torch.stack([r[index] for r in results])


@pytest.mark.parametrize("protocol", ["dpsgd", "hop", "prague", "adpsgd"])
def test_decentralized_protocols_on_thread_ranks_mix_and_end_in_consensus(loopback, protocol):
    min_groups = 20 if protocol in ("prague", "adpsgd") else 0  # Hop and D-PSGD mix at every step
    board = [0] * 4
    results = run_threads(_gossip, 4, (protocol, 60, {}, min_groups, board, threading.Barrier(4)), timeout_s=45)
    assert min(board) >= min_groups, board
    starts, before, after = _stack(results, 0), _stack(results, 1), _stack(results, 2)
    assert not any(r[3] for r in results)  # no default process group: the injected transport carried it all
    spread = lambda x: float((x - x.mean(0)).norm())  # noqa: E731
    # they mixed before finish, not only in its final average (without communication: 1x; under load, once
    # every worker starts together and goes on until all were in 20 groups: below 0.001x in 24 runs of
    # AD-PSGD and Prague beside four CPU burners; before, a late rank read 0.29x)
    assert spread(before) < 0.1 * spread(starts)
    assert spread(after) < 1e-9  # finish: every rank holds the consensus model
    if protocol in KEEP_THE_MEAN:
        assert torch.allclose(before.mean(0), starts.mean(0), atol=1e-9)


def test_the_parameter_server_on_thread_ranks_serves_rank_zeros_model():
    results = run_threads(_gossip, 3, ("ps", 10, {}))
    for result in results:
        assert torch.equal(result[2], results[0][0])  # no gradients: the server's model is rank 0's start


def test_compressed_gossip_on_thread_ranks_keeps_the_mean_and_converges():
    results = run_threads(_gossip, 4, ("dpsgd", 120, {"compression": "int8"}))
    starts, before = _stack(results, 0), _stack(results, 1)
    assert float((before - before.mean(0)).norm()) < 0.05 * float((starts - starts.mean(0)).norm())
    assert torch.allclose(before.mean(0), starts.mean(0), atol=0.02 * float(starts.abs().max()))


def _one_dies(rank, protocol: str, members: SharedMembership):
    model = _model(rank.rank)
    sync = MAKERS[protocol](model, rank.transport(protocol), on_failure="continue")
    told: set[int] = set()
    for step in range(40):
        if rank.rank == 3 and step == 10:  # this rank dies: it leaves without a word, the membership says so
            members.kill(3)
            sync.close()
            return None
        for dead in members.dead() - told:  # the Group Generator's host hears of it (as the launcher tells it)
            sync._worker_left(dead)
            told.add(dead)
        time.sleep(0.003)
        sync.step()
    sync.finish()
    return model.weight.detach().clone()


@pytest.mark.parametrize("protocol", ["dpsgd", "hop", "prague", "adpsgd", "ps"])
def test_a_thread_rank_that_dies_is_routed_around_and_the_survivors_agree(loopback, protocol):
    members = SharedMembership()
    results = run_threads(_one_dies, 4, (protocol, members), membership=members, timeout_s=30)
    survivors = torch.stack(results[:3])
    assert results[3] is None
    assert float((survivors - survivors.mean(0)).norm()) < 1e-9  # consensus over the survivors


class RecordingTransport(Transport):
    """A transport that records every payload message its protocol's channels send: the seam a fake uses."""

    def channels(self, *args, **kwargs):
        channels = super().channels(*args, **kwargs)
        send, sent = channels.send, SENT.setdefault(self.job.rank, [])

        def recorded(channel, dsts, kind, iteration=0, count=0, payload=None):
            if payload is not None:
                sent.extend(dsts)
            return send(channel, dsts, kind, iteration, count, payload)

        channels.send = recorded
        return channels


SENT: dict[int, list[int]] = {}


def _recorded(rank, protocol: str, steps: int):
    model = _model(rank.rank)
    transport = RecordingTransport(rank.transport(protocol).job)
    sync = MAKERS[protocol](model, transport)
    for _ in range(steps):
        sync.step()
    sync.finish()
    return model.weight.detach().clone(), sync.metrics()


@pytest.mark.parametrize("protocol", ["hop", "ps"])
def test_every_model_a_protocol_sends_goes_through_its_transports_channels(protocol):
    SENT.clear()
    results = run_threads(_recorded, 3, (protocol, 8))
    finals = [final for final, _ in results]
    # what went through the channels was used: every rank ends with one model (no gradients: the server's
    # is rank 0's start)
    assert all(torch.allclose(final, finals[0], atol=1e-12) for final in finals)
    if protocol == "ps":
        assert torch.equal(finals[1], _model(0).weight.detach())
    if protocol == "hop":  # ring of 3: models go to both neighbours (but for iterations a worker skipped)
        for rank in range(3):
            assert set(SENT[rank]) == {(rank + 1) % 3, (rank - 1) % 3}
        assert sum(len(SENT[rank]) for rank in range(3)) == sum(m["updates_received"] for _, m in results)
    else:  # each worker pushes 8 deltas to rank 0, which answers each with a model
        assert sorted(SENT[0]) == sorted([1, 2] * 8)
        assert SENT[1] == SENT[2] == [0] * 8

