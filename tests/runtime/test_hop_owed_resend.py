"""A repair's owed model, still pending when the next regular send goes out (a repair at the top of a wait
that returned at once): the regular send gave every out-neighbour a newer model, so the older one is owed to
nobody. It went to the new neighbour after the newer one (its queue out of iteration order) and, compressed,
as a delta to it alone (the other neighbours' copies drifted)."""

import threading
import types

import torch

from hetrain.compression.codecs import make_codec
from hetrain.compression.gossip_codec import PublicCopy
from hetrain.runtime.hop import Hop
from hetrain.transport.peer_channels import DELTA, KEYFRAME


def test_an_owed_model_is_not_sent_after_a_newer_one_to_the_same_neighbour():
    sent = []

    class Channels:
        forgotten = set()

        def send(self, channel, dsts, kind, iteration=0, count=0, payload=None):
            sent.extend((kind, d, iteration) for d in dsts)

    hop = object.__new__(Hop)  # the send path alone, on a stub transport
    hop.channels, hop._progress, hop.tolerant, hop._cond = Channels(), None, True, threading.Condition()
    hop._model_bytes, hop._steps_this_exchange, hop._local_steps = 400, 1, 1
    hop.stats = types.SimpleNamespace(extra={"uncompressed_bytes": 0, "compressed_bytes": 0})
    hop._public = PublicCopy(make_codec("int8", 100))
    start = torch.randn(100)
    hop._public.seed(start, [1, 2])
    hop.logic = types.SimpleNamespace(out_neighbors=[1, 2])
    hop._resend = None
    hop._send_model(0, start + 0.1)
    hop.logic.out_neighbors = [1, 2, 3]  # a repair: 3 is a new out-neighbour, owed the model of iteration 0
    hop._resend = ([3], *hop._last_sent)
    hop._send_model(1, start + 0.2)
    to_3 = [(kind, iteration) for kind, d, iteration in sent if d == 3]
    assert to_3 == [(KEYFRAME, 1)]  # the newer model, in full; nothing older after it
    assert all(kind == DELTA for kind, d, _ in sent if d in (1, 2))
