"""Local steps, outer optimizers, compression and emulated links on real multi-process jobs (gloo)."""

import time

import pytest
import torch
from comm_models import Quadratic, _make, _train_steps
from torch import nn

import hetrain
from hetrain.jobs.local_job import run_local
from hetrain.protocols.options import OptionError
from hetrain.transport.data_plane import LAYOUT_ENV
from hetrain.transport.job import JobView
from hetrain.transport.link import EmulatedLink
from hetrain.transport.link_spec import LinkSpec
from hetrain.transport.peer_channels import STOP, UPDATE, PeerChannels

# ----- H = 1, no compression: today's protocols, bit for bit --------------------------------------------
# (first four values and the sum of each worker's final model, before finish(), as the code before local
# steps and compression existed computed them: commit 69bf4ad, the same job)
GOLDEN = {
    "dpsgd": [([0.18265860595444003, 0.21281729473606678, -0.3590814969191242, 0.1336110187928689], -1.7772552462263147),
              ([0.15094193215880858, 0.13225126395316059, -0.47160502035747137, 0.0545677037022704], -2.788627914426153),
              ([0.17062974253273233, 0.3253508328123891, -0.2650116753973885, 0.1757526949325817], -2.674805831413793),
              ([0.12421753560185683, 0.21450594017157382, -0.2840656244674471, 0.16471827262278707], -0.8538231928412567)],
    "prague": [([0.19994221636669096, 0.1094564518259767, -0.5108180951494375, 0.04758738021681575], -2.5249185156455294),
               ([0.19994221636669096, 0.1094564518259767, -0.5108180951494375, 0.04758738021681575], -2.5249185156455294),
               ([0.11428169175722781, 0.3330062140106185, -0.17906381342127806, 0.21673746480843828], -1.5223375768082297),
               ([0.11428169175722781, 0.3330062140106185, -0.17906381342127806, 0.21673746480843828], -1.5223375768082297)],
    "ps": [([-0.20551702001874964, 0.2708444293301979, 0.23788944508895776, 0.25215208108060894], -1.506858475690269)] * 4,
}
GOLDEN["hop"] = GOLDEN["dpsgd"]  # Hop without backup workers, staleness or skipping mixes as D-PSGD does


def _deterministic_job(ctx, protocol):
    model = Quadratic(ctx.rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sync = _make(protocol, model, optimizer, sync_every=1, compression="none", local_work="fixed", link=None)
    _train_steps(model, optimizer, 12, ctx.rank)
    before = model.w.detach().clone()
    sync.finish()
    return [float(v) for v in before[:4]], float(before.sum())


@pytest.mark.parametrize("protocol, layout", [("dpsgd", "shared"), ("hop", "shared"), ("prague", None), ("ps", None),
                                              ("dpsgd", "split"), ("hop", "split")])
def test_h1_without_compression_reproduces_the_protocols_bit_for_bit(processes, protocol, layout, monkeypatch):
    if layout:  # the peer channels' data plane: NCCL's layout (a group per direction) run over gloo
        monkeypatch.setenv(LAYOUT_ENV, layout)
    assert [tuple(r) for r in run_local(_deterministic_job, 4, (protocol,), timeout_s=30)] == \
        [tuple(r) for r in GOLDEN[protocol]]


# ----- pseudo-gradients and the outer optimizer ----------------------------------------------------------
H = 4


def _one_exchange(ctx, protocol):
    """Every worker holds the same model and data, so the exchange's average is each one's own model.
    Two protocol instances one after the other: outer SGD of lr 1 without momentum, then Nesterov."""
    results = {}
    for outer_kind, outer_args in (("sgd", {"lr": 1.0}), ("nesterov", {"lr": 0.7, "momentum": 0.9, "nesterov": True})):
        model, reference = Quadratic(0), Quadratic(0)
        inner = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        reference_inner = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
        outer = torch.optim.SGD(model.parameters(), **outer_args)
        sync = _make(protocol, model, inner, sync_every=H, outer_optimizer=outer)
        anchor = reference.w.detach().clone()
        for step in range(H):  # the reference: H plain local steps, no exchange
            if protocol == "adpsgd" and ctx.rank % 2 and step == H - 1:
                # a passive serves the pairs queued for it when it syncs: let the active's request be
                # queued first, or it serves the pair later, with a model past its own outer step
                time.sleep(0.5)
            for net, opt in ((model, inner), (reference, reference_inner)):
                opt.zero_grad()
                net.loss(step, 0).backward()
                opt.step()  # the model's optimizer step runs the exchange at step H
        after, local = model.w.detach().clone(), reference.w.detach().clone()
        # torch's own outer step on the averaged pseudo-gradient (here: the one local pseudo-gradient)
        expected = anchor.clone().requires_grad_(True)
        expected.grad = anchor - local
        torch.optim.SGD([expected], **outer_args).step()
        sync.finish()  # (tensors through the launcher's queue need their sender alive: numpy instead)
        results[outer_kind] = (after.numpy(), local.numpy(), expected.detach().numpy(), sync.metrics())
    return results


@pytest.mark.parametrize("protocol, workers", [("dpsgd", 3), ("hop", 3), ("prague", 2), ("adpsgd", 2), ("ps", 2)])
def test_one_exchange_of_pseudo_gradients(processes, protocol, workers):
    for results in run_local(_one_exchange, workers, (protocol,), timeout_s=30):
        for outer_kind, (*arrays, metrics) in results.items():
            after, local, expected = (torch.from_numpy(a) for a in arrays)
            assert metrics["exchanges"] == 1 and metrics["iterations"] == H and metrics["outer_steps"] == 1
            if outer_kind == "sgd":  # lr 1, no momentum: the average itself, i.e. H plain local steps
                assert torch.allclose(after, local, rtol=0, atol=1e-12)
            else:
                assert torch.allclose(after, expected, rtol=0, atol=1e-12)
                assert not torch.allclose(after, local, atol=1e-3)  # the outer step did something


# ----- compression ---------------------------------------------------------------------------------------
def _gossip(ctx, protocol, steps):
    """Averaging only (no gradients), with int8, int4 and top-10% messages."""
    results = {}
    for compression in ("int8", "int4", "topk:0.1"):
        model = Quadratic(ctx.rank, size=61)  # int8 of 61 values is 65 bytes: the gathered weight is unaligned
        with torch.no_grad():
            model.w.add_(10.0 * ctx.rank)
        start = model.w.detach().clone()
        sync = _make(protocol, model, None, compression=compression)
        for _ in range(steps):
            time.sleep(0.01)  # a step's compute (else AD-PSGD's passives, which wait on nobody, finish first)
            sync.step()
        before = model.w.detach().clone()
        sync.finish()
        results[compression] = (start.numpy(), before.numpy(), sync.metrics())
    return results


@pytest.mark.parametrize("protocol", ["dpsgd", "hop", "prague", "adpsgd"])
def test_compressed_gossip_reaches_consensus_and_keeps_the_mean(processes, protocol):
    by_worker = run_local(_gossip, 4, (protocol, 60), timeout_s=30)
    for compression in ("int8", "int4", "topk:0.1"):
        results = [worker[compression] for worker in by_worker]
        starts = torch.stack([torch.from_numpy(s) for s, _, _ in results])
        models = torch.stack([torch.from_numpy(b) for _, b, _ in results])
        spread_start = float((starts - starts.mean(0)).norm())
        spread = float((models - models.mean(0)).norm())
        assert spread < 0.1 * spread_start, compression  # mixed before finish(): compression did not stop it
        # doubly-stochastic mixing (the ring's, a group's) keeps the mean, compressed or not
        assert torch.allclose(models.mean(0), starts.mean(0), atol=1e-2 * spread_start)
        ratios = [m["compression_ratio"] for _, _, m in results]
        assert min(ratios) > 1.5, (compression, ratios)  # keyframes (the first message to a peer) go in full


def _ps_compressed(ctx, compression):
    model = Quadratic(ctx.rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    sync = hetrain.ParameterServer(model, optimizer, staleness=0, compression=compression)
    _train_steps(model, optimizer, 40, ctx.rank)
    mine = model.w.detach().clone()
    sync.finish()
    return mine.numpy(), model.w.detach().numpy(), sync.metrics()


def test_the_parameter_server_compresses_both_ways_and_its_workers_follow_the_global_model(processes):
    results = run_local(_ps_compressed, 3, ("int8",), timeout_s=30)
    final = torch.from_numpy(results[0][1])
    for mine, _, _ in results:
        assert float((torch.from_numpy(mine) - final).norm()) < 0.05 * float(final.norm())  # each holds the global model, nearly
    assert results[1][2]["compression_ratio"] > 3.5  # a worker's pushes: int8
    assert results[0][2]["compression_ratio"] > 3.0  # rank 0: the answers (the first to each in full)


def _ddp(ctx, compression):
    model = nn.Linear(32, 32, bias=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    sync = hetrain.AllReduce(model, optimizer, compression=compression)
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(ctx.rank))
    ratios = []
    for _ in range(24):
        optimizer.zero_grad()
        sync.module(x).pow(2).mean().backward()
        optimizer.step()
        ratios.append(sync.metrics()["compression_ratio"])
    sync.finish()
    return sync.metrics(), ratios


@pytest.mark.parametrize("compression, ratio", [("bf16", 2.0), ("powersgd:2", 4.0)])
def test_allreduce_compresses_with_torchs_own_hooks(processes, compression, ratio):
    for metrics, ratios in run_local(_ddp, 2, (compression,), timeout_s=30):
        assert metrics["bytes_sent"] > 0 and metrics["compression_ratio"] >= ratio
        if compression.startswith("powersgd"):  # torch's hook all-reduces its first 2 iterations uncompressed
            assert ratios[:2] == [pytest.approx(1.0), pytest.approx(1.0)] and ratios[2] > 1.2  # (cumulative)


def test_allreduce_refuses_what_ddp_cannot_do():
    model = nn.Linear(2, 2)
    for kwargs, message in (({"compression": "int8"}, "torch's own hooks"), ({"sync_every": 4}, "every step")):
        with pytest.raises(OptionError, match=message):
            hetrain.AllReduce(model, **kwargs)


# ----- the emulated link ---------------------------------------------------------------------------------
MESSAGES, NUMEL, MBPS = 8, 3125, 1.0  # 8 messages of 12.5 KB at 1 Mbit/s: 0.8 s


def _message_train(ctx):
    job = JobView.of(None, torch.device("cpu"), 30.0, "link-test")
    link = EmulatedLink(LinkSpec.parse(MBPS), ctx.rank)
    arrivals = []
    channels = PeerChannels(job, NUMEL, torch.float32, lambda m: arrivals.append(time.time()),
                            lambda peer, error: arrivals.append(error), link=link)
    peer = 1 - ctx.rank
    channels.handshake([peer], [peer])
    channels.listen("update", [peer] if ctx.rank == 1 else [])
    if ctx.rank == 0:
        began = time.time()
        for k in range(MESSAGES):
            channels.send("update", [1], UPDATE, k, 1, torch.zeros(NUMEL))
        channels.send("update", [1], STOP)
        channels.flush()
        result = began
    else:
        channels.join()
        result = arrivals
    channels.close()
    return result, link.counters()


def test_a_message_train_takes_its_bytes_over_the_link_rate(processes):
    (began, sent), (arrivals, received) = run_local(_message_train, 2, timeout_s=30)
    nbytes = sent["bytes_sent"]
    assert nbytes == received["bytes_received"] >= MESSAGES * NUMEL * 4
    expected_s = nbytes * 8 / (MBPS * 1e6)
    took = arrivals[-1] - began
    assert took == pytest.approx(expected_s, rel=0.10), (took, expected_s)
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:-1])]  # messages arrive one transfer apart
    assert min(gaps) > 0.5 * (NUMEL * 4 * 8 / (MBPS * 1e6))


# ----- work sized to speed --------------------------------------------------------------------------------
def _auto(ctx):
    model = Quadratic(ctx.rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    sync = hetrain.Hop(model, optimizer, topology="ring", sync_every=8, local_work="auto")
    steps_seen = []
    deadline = time.monotonic() + 4.0
    while not sync.should_stop(time.monotonic() > deadline):
        time.sleep(0.04 if ctx.rank == 0 else 0.01)  # worker 0 computes 4x slower
        optimizer.zero_grad()
        model.loss(0, ctx.rank).backward()
        optimizer.step()
        steps_seen.append(sync.steps_this_exchange)
    sync.finish()
    return sync.metrics()


def test_auto_local_work_gives_a_slower_worker_fewer_local_steps(processes):
    results = run_local(_auto, 3, timeout_s=30)
    slow, fast = results[0], results[1:]
    assert slow["local_steps_last"] <= 3 and all(m["local_steps_last"] >= 6 for m in fast)
    # they reach exchanges together: exchange counts within a few of each other, not 4x apart
    assert slow["exchanges"] >= 0.6 * min(m["exchanges"] for m in fast)
    # one iteration counter, in local steps (steps computed plus the skipped exchanges' H each), not the
    # logic's count of exchanges (which metrics() once reported, H times smaller at the end of a run)
    for m in results:
        assert m["iteration"] == m["iterations"] + 8 * m["skipped_iterations"], m
        assert m["exchange_iteration"] < m["iteration"]


def _group_over_link(ctx, protocol):
    model = nn.Module()
    model.w = nn.Parameter(torch.zeros(62_500))  # 250 KB: 0.25 s of an 8 Mbit/s link per P-Reduce of two
    sync = {"prague": lambda: hetrain.Prague(model, None, gg="static", group_size=2, preduce_overlap=0, link=8.0),
            "adpsgd": lambda: hetrain.ADPSGD(model, None, link=8.0)}[protocol]()
    began = time.perf_counter()
    for _ in range(4):
        sync.step()
    took = time.perf_counter() - began
    sync.finish()
    return took, sync.link.counters()


@pytest.mark.parametrize("protocol", ["prague"])
def test_a_group_average_holds_its_members_for_its_bytes_over_the_link(processes, protocol):
    for took, counters in run_local(_group_over_link, 2, (protocol,), timeout_s=30):
        expected_s = 4 * 62_500 * 4 * 8 / 8e6  # each member sends the other its model, 4 times
        assert counters["bytes_sent"] >= 4 * 62_500 * 4
        assert took >= 0.9 * expected_s, (took, expected_s)


def _gg_round_trips(ctx):
    model = nn.Module()
    model.w = nn.Parameter(torch.zeros(16))
    sync = hetrain.Prague(model, None, group_size=2, gg_prefetch_ms=0, preduce_overlap=0,
                          link=LinkSpec.parse(None, "100"))  # 100 ms one way, no bandwidth limit
    for _ in range(5):
        sync.step()
    sync.finish()
    return sync.metrics()


def test_the_group_generators_round_trip_pays_the_link_latency(processes):
    """Worker 1 asks rank 0's Group Generator over the network: each of its 5 requests (and its leave)
    waits two latencies; rank 0 asks its own in-process."""
    _, asker = run_local(_gg_round_trips, 2, timeout_s=30)
    assert asker["gg_wait_s"] >= 5 * 2 * 0.100 * 0.95, asker["gg_wait_s"]
    assert asker["bytes_sent"] > 0


def _shared_start(ctx, same):
    model = Quadratic(0 if same else ctx.rank, size=256)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    sync = _make("dpsgd", model, optimizer, compression="int8")
    _train_steps(model, optimizer, 4, ctx.rank)
    sync.finish()
    return sync.metrics()


def test_neighbours_that_start_from_one_model_skip_the_first_keyframe(processes):
    """hetrain train's workers start from one seeded model: the first message on each edge is a delta
    (4 int8 messages: ratio near int8's 4x; with a float64 keyframe first it is under 2x)."""
    for metrics in run_local(_shared_start, 3, (True,), timeout_s=30):
        assert metrics.get("shared_start_edges", 0) == 2 and metrics["compression_ratio"] > 3.5, metrics
    for metrics in run_local(_shared_start, 3, (False,), timeout_s=30):  # other starts: keyframes, as before
        assert metrics.get("shared_start_edges", 0) == 0 and metrics["compression_ratio"] < 2.0, metrics
