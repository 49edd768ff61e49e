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
from hetrain.topology import make_topology
from hetrain.transport.membership import Membership


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
