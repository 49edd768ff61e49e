"""One queueing rule for the emulated network: the runtime's EmulatedLink (on a wall clock) and the
simulator's Network (on simulated time) book a sequence of messages to the same arrival times."""

import pytest

from hetrain.sim.network import Network, NetworkParams
from hetrain.transport import link as link_module
from hetrain.transport.link import EmulatedLink
from hetrain.transport.link_spec import LinkSpec, book_egress, book_ingress

SPEC = LinkSpec.parse("0:10,1:40,*:100", "0:2,*:1")  # unequal links: a slow sender, a fast receiver
MESSAGES = [(0, 0, 2, 250_000), (0.001, 0, 2, 250_000), (0.002, 1, 2, 500_000), (0.030, 2, 0, 100_000),
            (0.031, 1, 0, 400_000), (0.2, 0, 1, 50_000)]  # (sent at, src, dst, bytes)


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.held = []

    def time(self):
        return self.now


def test_the_runtime_and_the_simulator_book_messages_alike(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(link_module.time, "time", clock.time)
    links = [EmulatedLink(SPEC, rank) for rank in range(3)]
    for link in links:
        monkeypatch.setattr(link, "_hold_until", clock.held.append)
    network = Network(NetworkParams(latency_us=0.0, bandwidth_gbps=1e12), 3, SPEC)  # only the link spec counts
    for at, src, dst, nbytes in MESSAGES:
        clock.now = at
        stamps = links[src].depart(nbytes, dst)
        links[dst].arrive(nbytes, src, stamps)
        simulated = network.send(at, src, dst, nbytes)
        assert clock.held[-1] == pytest.approx(simulated, abs=2e-6)  # stamps travel in whole microseconds


def test_fifo_links_queue_and_a_slow_sender_keeps_the_receiver_busy():
    start, free = book_egress(free=1.0, now=0.5, transfer_s=0.2)
    assert (start, free) == (1.0, 1.2)  # waits for the link, then holds it
    arrival, free = book_ingress(free=0.0, first_bit=1.0, last_bit=3.0, transfer_s=0.1)
    assert arrival == free == 3.0  # the last bit, sent at the slow sender's rate, ends the message
    arrival, _ = book_ingress(free=5.0, first_bit=1.0, last_bit=3.0, transfer_s=0.1)
    assert arrival == pytest.approx(5.1)  # a busy ingress link: it streams in after the message before


def test_a_message_booked_after_one_sent_behind_it_keeps_its_own_time(monkeypatch):
    """The runtime's receiver threads book as their real receives end: a token sent just behind a 16 MB
    update to the same peer finished first and booked the ingress from its own first bit; the update then
    queued behind it and arrived after twice its transfer (2.56 s where the simulator says 1.28 s)."""
    clock = FakeClock()
    monkeypatch.setattr(link_module.time, "time", clock.time)
    spec = LinkSpec.parse("100", None)
    sender, receiver = EmulatedLink(spec, 0), EmulatedLink(spec, 1)
    monkeypatch.setattr(receiver, "_hold_until", clock.held.append)
    update = sender.depart(16_000_000, 1)
    token = sender.depart(40, 1)
    receiver.arrive(40, 0, token)  # the token's receive ends first
    receiver.arrive(16_000_000, 0, update)
    token_at, update_at = clock.held
    assert update_at == pytest.approx(1.28, abs=1e-5) and token_at >= update_at
    network = Network(NetworkParams(latency_us=0.0, bandwidth_gbps=1e12), 2, spec)
    assert network.send(0.0, 0, 1, 16_000_000) == pytest.approx(update_at, abs=2e-6)  # the simulator's time


def test_a_message_that_never_left_is_neither_counted_nor_holds_the_link(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(link_module.time, "time", clock.time)
    link = EmulatedLink(LinkSpec.parse("100", "1"), 0)
    stamps = link.depart(1_000_000, 1)
    link.unsent(1_000_000, 1, stamps)  # its send failed at once (the peer was gone)
    assert link.counters()["bytes_sent"] == 0 and link.counters()["messages_sent"] == 0
    assert link.depart(1_000, 1)[0] == pytest.approx(1_000, abs=2)  # the next one leaves at once: 1 ms latency


def test_bookings_in_first_bit_order_are_the_sequential_rule_s_and_in_any_order_never_overlap():
    import random

    from hetrain.transport.link_spec import book_ingress_any_order

    rng = random.Random(0)
    for _ in range(200):
        messages = sorted((rng.uniform(0, 5), rng.uniform(0.01, 0.5), rng.choice([1, 2])) for _ in range(20))
        busy, free = [], 0.0
        for first_bit, transfer, slow in messages:
            arrival, free = book_ingress(free, first_bit, first_bit + slow * transfer, transfer)
            assert book_ingress_any_order(busy, first_bit, first_bit + slow * transfer, transfer) == \
                pytest.approx(arrival, abs=1e-9)
        busy = []
        rng.shuffle(messages)
        for first_bit, transfer, _ in messages:
            assert book_ingress_any_order(busy, first_bit, first_bit + transfer, transfer) >= first_bit + transfer
        assert all(a[1] <= b[0] + 2e-6 for a, b in zip(busy, busy[1:]))  # one message at a time on the link
