"""A compressed P-Reduce's arithmetic, members on threads over a stand-in all-gather (no processes)."""

import threading

import pytest
import torch

from hetrain.compression.codecs import make_codec
from hetrain.compression.preduce_compressed import GroupReplicas, compressed_exchange


class _Gather:
    """All-gather among ``size`` threads: each puts its message, then every one copies all of them."""

    def __init__(self, size):
        self.messages = [None] * size
        self.barrier = threading.Barrier(size, timeout=30)

    def member(self, index):
        gather = self

        class Comm:
            def allgather(self, outputs, inputs):
                gather.messages[index] = inputs[0]
                gather.barrier.wait()
                for out, message in zip(outputs[0], gather.messages):
                    out.copy_(message)
                gather.barrier.wait()

        return Comm()


def _exchange(models, spec, gamma, weights):
    size, numel = len(models), models[0].numel()
    start = torch.stack(models).mean(0)  # the copies start at the set's first (plain) average
    replicas = [GroupReplicas(start, size) for _ in range(size)]
    gather, bufs = _Gather(size), [m.clone() for m in models]
    codecs = [make_codec(spec, numel) for _ in range(size)]
    threads = [threading.Thread(target=compressed_exchange, args=(
        gather.member(i), bufs[i], i, size, codecs[i], replicas[i], gamma, weights[i], lambda work: None))
        for i in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return bufs, replicas


def test_uncompressed_members_move_to_the_weighted_mean_by_the_step():
    """Code "none": the copies become the models, and each member moves ``gamma`` of the way to the
    steps-weighted mean (weights 1, 2, 5): a rule that ignored the weights, or moved from the own
    copy's side with the wrong sign, ends elsewhere."""
    gen = torch.Generator().manual_seed(0)
    models = [torch.randn(1000, generator=gen) + 3 * i for i in range(3)]
    weights = [1.0, 2.0, 5.0]
    mean = sum(w * m for w, m in zip(weights, models)) / sum(weights)
    for gamma in (1.0, 0.5):
        bufs, replicas = _exchange(models, "none", gamma, weights)
        for model, buf in zip(models, bufs):
            assert torch.allclose(buf, model + gamma * (mean - model), atol=1e-5)
        for held in replicas:  # every member's copies agree and hold the models
            for copy, model in zip(held.publics, models):
                assert torch.allclose(copy, model, atol=1e-5)


@pytest.mark.parametrize("spec", ["int8", "topk:0.1"])
def test_compressed_members_keep_the_group_s_sum_and_agree_on_the_copies(spec):
    """Equal weights, a lossy code: the sum of the members' models is what it was (the average is not
    changed by the compression), and every member holds the same copies."""
    gen = torch.Generator().manual_seed(1)
    models = [torch.randn(777, generator=gen) * (i + 1) for i in range(3)]
    bufs, replicas = _exchange(models, spec, 1.0, [None, None, None])
    assert torch.allclose(sum(bufs), sum(models), atol=1e-4)
    assert not torch.allclose(bufs[0], models[0])  # it moved
    for held in replicas[1:]:
        for a, b in zip(held.publics, replicas[0].publics):
            assert torch.equal(a, b)
