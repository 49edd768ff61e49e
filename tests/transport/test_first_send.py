"""The first message to a peer's new process is given up as soon as that process is named dead.

gloo connects a pair on its first message and waits until its timeout for a peer that never
connects; a replacement that died just after it was admitted held each neighbour's main thread that
long, and the others waited for those neighbours (a second kill 80-100 ms after the first: 3 of 16
runs failed after 20 s)."""

import threading
import time

import torch
import torch.distributed as dist

from hetrain.transport.job import JobView, prefer_lazy_connections
from hetrain.transport.peer_channels import UPDATE, PeerChannels

TIMEOUT_S = 20.0  # the send must end long before it (named dead at 0.5 s), on a busy machine too


def test_a_first_send_to_a_process_that_never_connects_ends_when_it_is_named_dead(loopback, monkeypatch):
    monkeypatch.delenv("TORCH_GLOO_LAZY_INIT", raising=False)
    prefer_lazy_connections()  # as every worker: pairs connect on their first message
    job = JobView(None, 0, 2, torch.device("cpu"), TIMEOUT_S, dist.HashStore())
    named_dead = threading.Event()
    errors = []
    channels = PeerChannels(job, 4, torch.float32, lambda message: None, lambda peer, text: errors.append((peer, text)),
                            tolerate_lost_peers=True, incarnation=0, peer_incarnations=[0, 1],
                            peer_gone=lambda peer, incarnation: named_dead.is_set() and (peer, incarnation) == (1, 1))
    threading.Timer(0.5, named_dead.set).start()  # the launcher names worker 1's replacement dead
    began = time.monotonic()
    channels.send("update", [1], UPDATE, 7, 1, torch.zeros(4))  # worker 1's process 1 never connects
    took = time.monotonic() - began
    assert took < TIMEOUT_S / 2, f"the send held this thread {took:.1f} s"  # not gloo's timeout
    assert [peer for peer, _ in errors] == [1] and "died" in errors[0][1], errors
