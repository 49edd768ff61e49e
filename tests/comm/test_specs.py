"""The pure communication specs: links, compression sizes, local work (no processes)."""

import math

import pytest

from hetrain.comm.local_work import steps_per_exchange, weights_by_steps
from hetrain.comm.settings import CommSettings
from hetrain.compression.spec import CompressionSpec
from hetrain.errors import UsageError
from hetrain.protocols.options import OptionError
from hetrain.transport.link_spec import LinkSpec, ring_allreduce_bytes


def test_link_spec_per_worker_values_and_the_rest():
    spec = LinkSpec.parse("0:50,*:1000", "0:80,*:1")
    assert spec.enabled
    assert spec.bytes_per_s(0) == 50e6 / 8 and spec.bytes_per_s(5) == 1000e6 / 8
    assert spec.transfer_s(0, 1_000_000) == pytest.approx(0.16)
    assert spec.path_latency_s(0, 3) == pytest.approx(0.08) and spec.path_latency_s(2, 3) == pytest.approx(0.001)
    partial = LinkSpec.parse("1:10")
    assert partial.bytes_per_s(0) is None and partial.transfer_s(0, 10**9) == 0.0
    assert not LinkSpec.parse(None, None).enabled and not LinkSpec.parse(None, "0").enabled


def test_a_collective_is_charged_at_its_bottleneck_member():
    spec = LinkSpec.parse("0:8,*:800", "10")  # worker 0: 1 MB/s
    sent = ring_allreduce_bytes(4, 1_000_000)
    assert sent == 1_500_000
    assert spec.collective_s(range(4), sent, sent, 6) == pytest.approx(1.5 + 6 * 0.01)
    assert spec.collective_s([1, 2], sent, sent, 2) == pytest.approx(0.015 + 0.02)
    assert spec.collective_s([3], sent, sent, 0) == 0.0


@pytest.mark.parametrize("text, message", [
    ("fast", "malformed --link-mbps"), ("0:-5", "finite number > 0"), ("0:0", "finite number > 0"),
    ("10,20", "all workers twice"), ("x:10", "not a worker index"), ("1:5,1:6", "given twice"),
])
def test_a_malformed_link_spec_is_one_line_naming_the_flag(text, message):
    with pytest.raises(UsageError, match=message) as info:
        LinkSpec.parse(text)
    assert "\n" not in str(info.value)


def test_a_link_spec_naming_a_missing_worker_is_refused():
    with pytest.raises(UsageError, match="names worker 9"):
        LinkSpec.parse("9:10").check_workers(8)


def test_compressed_sizes():
    n = 4810
    assert CompressionSpec.parse("none").payload_nbytes(n) == 4 * n
    assert CompressionSpec.parse("bf16").payload_nbytes(n) == 2 * n
    assert CompressionSpec.parse("int8").payload_nbytes(n) == n + 4 * math.ceil(n / 256)
    assert CompressionSpec.parse("int4").payload_nbytes(n) == 2405 + 4 * math.ceil(n / 256)
    assert CompressionSpec.parse("int4").payload_nbytes(n + 1) == 2406 + 4 * math.ceil(n / 256)
    assert CompressionSpec.parse("topk:0.01").payload_nbytes(n) == 8 * 49
    shapes = [(64, 64), (64,), (10, 64), (10,)]  # the digits MLP
    low = CompressionSpec.parse("powersgd:2")
    assert low.payload_nbytes(4810, shapes) == 4 * ((64 + 64) * 2 + 64 + (10 + 64) * 2 + 10)  # vectors raw
    assert CompressionSpec.parse("powersgd:9").payload_nbytes(4810, shapes) == 4 * ((64 + 64) * 9 + 64 + 640 + 10)
    assert CompressionSpec.parse("topk:0.01").default_gossip_step(n) == pytest.approx(8 * 49 / (4 * n))
    assert CompressionSpec.parse("int8").default_gossip_step(n) == 1.0
    assert CompressionSpec.parse("int4").default_gossip_step(n) == 1.0
    assert str(CompressionSpec.parse(" TopK:0.05 ")) == "topk:0.05"


@pytest.mark.parametrize("text, message", [
    ("zip", "unknown compression"), ("topk", "malformed"), ("topk:1.5", "in \\(0, 1\\)"),
    ("powersgd:0", "rank must be >= 1"), ("int8:3", "takes no argument"), ("int4:2", "takes no argument"),
])
def test_a_malformed_compression_is_refused(text, message):
    with pytest.raises(UsageError, match=message):
        CompressionSpec.parse(text)


def test_local_steps_follow_speed():
    assert steps_per_exchange(16, 0.1, 0.1) == 16
    assert steps_per_exchange(16, 0.2, 0.1) == 8  # twice as slow: half the steps
    assert steps_per_exchange(16, 1.0, 0.1) == 2
    assert steps_per_exchange(16, 100.0, 0.1) == 1  # never fewer than one
    assert steps_per_exchange(16, None, 0.1) == 16  # not measured yet
    own, others = weights_by_steps([1 / 3, 1 / 3], [8, 16], 16)  # a neighbour's weight scales by its steps
    assert own == pytest.approx(1 / 2) and others == pytest.approx([1 / 6, 1 / 3])
    assert weights_by_steps([0.25, 0.25], [16, 16], 16) == (0.5, [0.25, 0.25])  # all at H: the graph's own


@pytest.mark.parametrize("name", ["ring", "torus", "hypercube", "double_ring"])
def test_steps_weighted_mixing_keeps_the_steps_weighted_mean_on_symmetric_graphs(name):
    import numpy as np

    from hetrain.topology import make_topology

    topology = make_topology(name, 8)
    steps = np.array([2, 8, 8, 5, 8, 1, 8, 8], dtype=float)
    mixing = np.zeros((8, 8))
    for i, (weights, _) in enumerate(topology.mixing_weights):
        own, scaled = weights_by_steps(list(weights.values()), [steps[j] for j in weights], 8)
        mixing[i, list(weights)] = scaled
        mixing[i, i] = own
    assert np.allclose(mixing.sum(1), 1) and (mixing >= 0).all()
    assert np.allclose(steps @ mixing, steps)  # sum_i s_i x_i is kept: the steps-weighted mean


@pytest.mark.parametrize("workers", [6, 8, 16])
def test_circulation_weights_keep_the_steps_weighted_mean_on_the_directed_exponential_graph(workers):
    """The exponential graph is directed (i sends to i + 1, i + 2, i + 4, ...), so detailed balance
    cannot hold; scaling each row by s_min / s_i keeps sum_i s_i x_i all the same, and the chain still
    mixes (its second eigenvalue below 1). Scaling by the sender's steps, as on symmetric graphs, does not."""
    import numpy as np

    from hetrain.comm.local_work import weights_by_circulation
    from hetrain.topology import make_topology

    topology = make_topology("exponential", workers)
    assert not topology.is_symmetric and topology.is_doubly_stochastic
    steps = np.array([2, 8, 8, 5, 8, 1, 8, 8] * 2, dtype=float)[:workers]
    mixing, by_sender = np.zeros((workers, workers)), np.zeros((workers, workers))
    for i, (weights, _) in enumerate(topology.mixing_weights):
        own, scaled = weights_by_circulation(list(weights.values()), int(steps[i]), int(steps.min()))
        mixing[i, list(weights)], mixing[i, i] = scaled, own
        own, scaled = weights_by_steps(list(weights.values()), [steps[j] for j in weights], 8)
        by_sender[i, list(weights)], by_sender[i, i] = scaled, own
    assert np.allclose(mixing.sum(1), 1) and (mixing >= 0).all()
    assert np.allclose(steps @ mixing, steps)  # sum_i s_i x_i is kept: the steps-weighted mean
    assert sorted(abs(np.linalg.eigvals(mixing)))[-2] < 0.99
    assert not np.allclose(steps @ by_sender, steps)
    for weights, own in topology.mixing_weights:  # equal steps: the graph's own weights
        assert weights_by_circulation(list(weights.values()), 8, 8) == (pytest.approx(own), list(weights.values()))


@pytest.mark.parametrize("changes, message", [
    ({"sync_every": 0}, "sync_every"), ({"local_work": "auto"}, "sync_every"), ({"gossip_step": 1.5}, "gossip_step"),
    ({"outer_optimizer": "adam"}, "outer_optimizer"), ({"outer_optimizer": object()}, "outer_optimizer"), ({"outer_momentum": 1.0}, "outer_momentum"),
])
def test_comm_settings_refuse_what_cannot_work(changes, message):
    with pytest.raises(OptionError, match=message):
        CommSettings(**changes).validate()
    assert CommSettings().default and not CommSettings(sync_every=4).default
