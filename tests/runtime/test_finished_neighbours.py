"""A neighbour a repair gives a worker after that neighbour finished: counted as stopped, sent nothing.

A finished worker receives nothing more and never connects to a neighbour the repair gave it, so the
first message to it waited in gloo's lazy connect until the timeout while the others waited in the
final average for the sender ("worker 3 waited for workers [2] to reach the final average: none made a
step for 20 s", 1 run in 20 of ``benchmarks/finish_death_bench.py`` under load, in this tree and before)."""

import threading

from hetrain.protocols.hop_config import HopConfig
from hetrain.protocols.hop_logic import HopWorker
from hetrain.protocols.membership import repair
from hetrain.runtime.hop import Hop
from hetrain.runtime.protocol import ProtocolStats
from hetrain.topology import make_topology
from hetrain.transport.membership import LostPeers, Membership


class _Finished(Membership):
    """Rank 0 finished before it learned of rank 1's death: it sent its STOPs to its old neighbours only."""

    def finished_without_stop(self):
        return {0}, {0}


class _Channels:
    def __init__(self):
        self.forgotten, self.sent = set(), []

    def forget(self, peer):
        self.forgotten.add(peer)

    def send(self, channel, dsts, kind, iteration=0, count=0, payload=None):
        self.sent.extend(d for d in dsts if d not in self.forgotten)


def test_a_neighbour_that_finished_before_the_repair_is_stopped_and_sent_nothing():
    topology = repair(make_topology("ring", 4), {1})  # 0-1-2-3 without 1: rank 2's neighbours are 3 and 0
    hop = object.__new__(Hop)
    hop._cond = threading.Condition()
    hop.membership = _Finished()
    hop.channels = _Channels()
    hop.logic = HopWorker.for_rank(topology, 2, HopConfig(max_ig=4).validated_for(topology))
    assert set(hop.logic.out_neighbors) == {0, 3}
    hop._note_finished_neighbours()
    assert 0 in hop.channels.forgotten and 3 not in hop.channels.forgotten
    hop.channels.send("update", hop.logic.out_neighbors, 0)
    assert hop.channels.sent == [3]
    assert hop.logic.finished_senders == {0} and hop.logic.finished_token_sources == {0}  # never waited for


class _Replaced(Membership):
    """Rank 5 died and its replacement joined between two looks of rank 0 (it never saw 5 dead)."""

    def __init__(self):
        self.incarnation = [0, 0, 0, 0, 0, 1]

    def __call__(self):
        return set()

    def incarnations(self):
        return list(self.incarnation)

    def finished_without_stop(self):
        return set(), set()


class _Listening(_Channels):
    def __init__(self):
        super().__init__()
        self.listening: dict[str, set[int]] = {"update": set(), "token": set()}

    def listen(self, channel, sources):
        self.listening[channel] |= set(sources)

    def rejoin(self, peer, incarnation):
        pass


def test_a_death_and_its_replacement_seen_in_one_look_still_listens_on_the_edges_others_repaired():
    """Rank 4 saw rank 5 dead alone and repaired the ring 0-1-2-3-4-5 around it: for a while rank 0 was
    its neighbour, and it sends there (the owed model, updates, tokens). Rank 0, slow, saw the death and
    the join in one look and kept its graph: it must still use the edge to 4, or 4's first send waits
    in gloo's connect for ever (the waiting end has no timeout)."""

    ring = make_topology("ring", 6)
    hop = object.__new__(Hop)
    hop._cond = threading.Condition()
    hop.membership = hop._membership = _Replaced()
    hop.dead_workers = hop._membership
    hop.channels = _Listening()
    hop.config = HopConfig(max_ig=4).validated_for(ring)
    hop.original_topology = hop.topology = ring
    hop.logic = HopWorker.for_rank(ring, 0, hop.config)
    hop.job = type("Job", (), {"rank": 0, "world_size": 6})()
    hop.dead, hop.incarnations, hop.tolerant = set(), [0] * 6, True
    hop._public, hop._last_sent, hop._resend = None, None, None
    hop._channel_errors, hop._lost = [], LostPeers()
    hop.stats = ProtocolStats()
    hop.logic.receive_update(5, 7, "the dead process's update of iteration 7")
    hop.logic.tokens[5] = 0
    hop._check_deaths()
    assert set(hop.logic.in_weights) == {1, 5}  # its graph is the ring again
    assert 4 in hop.channels.listening["update"] and 4 in hop.channels.listening["token"]
    # the kept edge to 5 starts afresh (replace_neighbour): the replacement's updates may start below 7, and
    # a queue must stay in iteration order; its tokens are the edge's first ones again
    assert not hop.logic.queues[5] and hop.logic.updates_dropped == 1 and hop.logic.tokens[5] == 4
