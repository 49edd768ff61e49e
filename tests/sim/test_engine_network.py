"""The event engine and the network model against hand-computed answers."""

import pytest

from hetrain.sim.engine import Engine
from hetrain.sim.network import Network, NetworkParams, preduce_s, ring_allreduce_s

PARAMS = NetworkParams(latency_us=100.0, bandwidth_gbps=8.0)  # 100 us, 1e9 bytes/s


def test_engine_runs_in_time_order_and_breaks_ties_by_scheduling_order():
    engine = Engine()
    seen = []
    engine.at(2.0, seen.append, "c")
    engine.at(1.0, seen.append, "a")
    engine.at(1.0, seen.append, "b")
    engine.at(1.0, lambda: engine.after(0.5, seen.append, "b2"))
    assert engine.run() == 5
    assert seen == ["a", "b", "b2", "c"]
    assert engine.now == 2.0
    with pytest.raises(ValueError):
        engine.at(1.0, seen.append, "past")


def test_engine_stops_at_a_time_limit():
    engine = Engine()
    for t in (0.5, 1.0, 1.5):
        engine.at(t, lambda: None)
    assert engine.run(until_s=1.0) == 2
    assert engine.pending() == 1


def test_uncontended_message_is_latency_plus_bytes_over_bandwidth():
    net = Network(PARAMS, 3)
    assert net.send(1.0, 0, 1, 1e6) == pytest.approx(1.0 + 100e-6 + 1e-3)


def test_messages_from_one_sender_share_its_egress_link():
    net = Network(PARAMS, 3)
    first = net.send(0.0, 0, 1, 1e6)
    second = net.send(0.0, 0, 2, 1e6)
    assert first == pytest.approx(100e-6 + 1e-3)
    assert second == pytest.approx(100e-6 + 2e-3)


def test_messages_into_one_receiver_share_its_ingress_link_and_stay_fifo():
    net = Network(PARAMS, 3)
    a = net.send(0.0, 0, 2, 1e6)
    b = net.send(0.0, 1, 2, 1e6)
    assert (a, b) == (pytest.approx(100e-6 + 1e-3), pytest.approx(100e-6 + 2e-3))
    small_after_big = Network(PARAMS, 2)
    big = small_after_big.send(0.0, 0, 1, 1e6)
    small = small_after_big.send(0.0, 0, 1, 8)
    assert small > big  # one channel is FIFO


def test_ring_allreduce_cost_and_collective_booking():
    assert ring_allreduce_s(1, 1e6, PARAMS) == 0.0
    assert ring_allreduce_s(4, 4e6, PARAMS) == pytest.approx(6 * (100e-6 + 1e-3))
    net = Network(PARAMS, 4)
    net.send(0.0, 0, 1, 1e6)  # worker 0's egress busy until 1 ms
    start, end = net.collective(0.0, [0, 2], 2e6)
    assert start == pytest.approx(1e-3)
    assert end == pytest.approx(1e-3 + 2 * (100e-6 + 1e-3))
    assert net.send(start, 2, 3, 8) > end  # members are busy during the collective


def test_a_measured_collective_step_replaces_the_latency_in_ring_steps_only():
    slow = NetworkParams(latency_us=100.0, bandwidth_gbps=8.0, collective_step_us=900.0)
    assert ring_allreduce_s(4, 4e6, slow) == pytest.approx(6 * (900e-6 + 1e-3))
    assert Network(slow, 2).send(0.0, 0, 1, 1e6) == pytest.approx(100e-6 + 1e-3)  # messages keep the latency
    assert slow.as_dict()["collective_step_us"] == 900.0 and PARAMS.as_dict()["collective_step_us"] == 100.0


def test_preduce_cost_follows_the_runtimes_exchange_rule():
    assert preduce_s(1, 1e3, PARAMS) == 0.0
    # 20 KB among 3: a direct exchange, one latency and one buffer per peer
    assert preduce_s(3, 2e4, PARAMS) == pytest.approx(2 * (100e-6 + 2e4 / PARAMS.bytes_per_s))
    assert preduce_s(3, 2e4, PARAMS) < ring_allreduce_s(3, 2e4, PARAMS)
    # 40 MB: the ring, as gloo runs it
    assert preduce_s(4, 4e7, PARAMS) == ring_allreduce_s(4, 4e7, PARAMS)
    net = Network(PARAMS, 3)
    start, end = net.collective(0.0, [0, 1, 2], 2e4, preduce=True)
    assert end - start == pytest.approx(preduce_s(3, 2e4, PARAMS))
    assert net.messages == 6
