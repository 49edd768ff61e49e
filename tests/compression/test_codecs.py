"""Compressors and error feedback: sizes, determinism, and nothing lost over time."""

import pytest
import torch

from hetrain.compression.codecs import make_codec
from hetrain.compression.error_feedback import ErrorFeedback
from hetrain.compression.gossip_codec import PublicCopy, ReplicaSet, choco_mix

SHAPES = [(64, 64), (64,), (10, 64), (10,)]  # the digits MLP: 4,810 values
SPECS = ["none", "bf16", "int8", "int4", "topk:0.01", "powersgd:2"]


@pytest.mark.parametrize("spec", SPECS)
def test_payload_size_and_determinism(spec):
    x = torch.randn(4810, generator=torch.Generator().manual_seed(0))
    a, b = make_codec(spec, 4810, SHAPES), make_codec(spec, 4810, SHAPES)
    payload = a.encode(x)
    assert payload.dtype == torch.uint8 and payload.numel() == a.payload_nbytes
    assert torch.equal(payload, b.encode(x))  # every worker reconstructs the same bytes
    decoded = b.decode(payload)
    assert decoded.shape == (4810,) and torch.equal(decoded, a.decode(payload))
    error = float((decoded - x).norm() / x.norm())
    assert error < {"none": 1e-7, "bf16": 5e-3, "int8": 2e-2, "int4": 0.2, "topk:0.01": 1.0, "powersgd:2": 1.0}[spec]


def test_topk_keeps_exactly_the_largest_values_and_nothing_else():
    """The decoded vector is x on the k largest magnitudes and 0 elsewhere: a codec that kept other
    indices, or scaled what it kept, fails here (a loose bound on the error would not see it)."""
    x = torch.randn(4810, generator=torch.Generator().manual_seed(3))
    codec = make_codec("topk:0.01", 4810, SHAPES)
    decoded = codec.decode(codec.encode(x))
    largest = torch.topk(x.abs(), codec.k).indices
    assert torch.equal(decoded[largest], x[largest])
    kept = torch.zeros(4810, dtype=torch.bool)
    kept[largest] = True
    assert not decoded[~kept].any()


@pytest.mark.parametrize("case", ["spread", "every-third"])
def test_topk_keeps_exactly_the_largest_values_of_a_large_vector(case):
    """Above 131,072 values the top-k is found among the values a sample's threshold passes: still
    exactly the k largest, both when the sample is fair (``spread``) and when it misleads: 600 large
    values on every third index, the sampled ones, where k is 1,000 (``every-third``: too few pass,
    and the whole vector is searched)."""
    numel = 200_000
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(numel, generator=generator)
    if case == "every-third":
        x = x * 0.01
        x[0: 3 * 600: 3] = 10.0 + torch.rand(600, generator=generator)
    codec = make_codec("topk:0.005", numel)
    assert codec.k == 1000
    decoded = codec.decode(codec.encode(x))
    kept = torch.zeros(numel, dtype=torch.bool)
    kept[torch.topk(x.abs(), codec.k).indices] = True
    assert torch.equal(decoded[kept], x[kept]) and not decoded[~kept].any()


@pytest.mark.parametrize("numel", [4810, 200_000])
def test_topk_breaks_ties_at_the_kth_magnitude_by_the_lowest_index(numel):
    """3,000 values of magnitude 5 (signs alternating, from index 100) among small ones, k = 1,000 or
    24: the ties go to the lowest indices, on the small path and the sampled one alike (a bf16 model
    upcast to float32 is full of ties; torch.topk broke them as it liked)."""
    x = torch.rand(numel, generator=torch.Generator().manual_seed(9)) * 0.1
    count = min(3000, numel // 2)
    x[100: 100 + count] = 5.0 * (torch.arange(count) % 2 * 2 - 1)
    x[numel - 1] = 7.0  # one above them all, at the end
    codec = make_codec("topk:0.005", numel)
    sent = codec.encode(x)[: 4 * codec.k].view(torch.int32).long()
    assert sent.tolist() == list(range(100, 100 + codec.k - 1)) + [numel - 1]


def test_topk_sends_a_nan_the_sample_did_not_see():
    """A NaN where the sample does not look (index 1 of a 200,000-value vector sampled every third
    index) is sent, as ``torch.topk`` over the whole vector ranks it first: a receiver's copy shows it."""
    x = torch.randn(200_000, generator=torch.Generator().manual_seed(8))
    x[1] = float("nan")
    codec = make_codec("topk:0.005", x.numel())
    assert torch.isnan(codec.decode(codec.encode(x))[1])


def test_powersgd_reconstructs_a_low_rank_model_and_sends_vectors_whole():
    gen = torch.Generator().manual_seed(4)
    parts = [torch.randn(64, 2, generator=gen) @ torch.randn(2, 64, generator=gen), torch.randn(64, generator=gen),
             torch.randn(10, 2, generator=gen) @ torch.randn(2, 64, generator=gen), torch.randn(10, generator=gen)]
    x = torch.cat([p.reshape(-1) for p in parts])
    codec = make_codec("powersgd:2", 4810, SHAPES)
    decoded = codec.decode(codec.encode(x))
    assert float((decoded - x).norm() / x.norm()) < 1e-4  # rank 2 holds a rank-2 matrix whole
    assert torch.equal(decoded[4096:4160], x[4096:4160])  # a bias goes uncompressed


@pytest.mark.parametrize("spec", ["int8", "int4", "bf16"])
def test_quantizers_decode_to_the_values_not_a_scaled_copy(spec):
    x = torch.randn(4810, generator=torch.Generator().manual_seed(5))
    codec = make_codec(spec, 4810, SHAPES)
    decoded = codec.decode(codec.encode(x))
    # least-squares scale of decoded against x: 1 for a faithful codec
    assert abs(float(decoded @ x) / float(x @ x) - 1.0) < 1e-2


@pytest.mark.parametrize("spec", SPECS)
def test_error_feedback_loses_nothing_over_a_thousand_rounds(spec):
    """Sum of what was transmitted, plus the residual still held, equals the sum of the inputs."""
    x = torch.randn(4810, generator=torch.Generator().manual_seed(1))
    feedback = ErrorFeedback(make_codec(spec, 4810, SHAPES))
    transmitted = torch.zeros(4810, dtype=torch.float64)
    rounds = 1000
    for _ in range(rounds):
        _, sent = feedback.encode(x)
        transmitted += sent.double()
    total = rounds * x.double()
    assert torch.allclose(transmitted + feedback.residual.double(), total, rtol=0, atol=1e-3 * float(x.abs().max()))
    # and the residual stays bounded: what is held back does not grow with the rounds
    assert float(feedback.residual.norm()) < 0.2 * float(total.norm())


def test_choco_copies_agree_and_mixing_keeps_the_sum():
    """A sender's public copy and its receiver's replica stay bit-identical; with symmetric weights the
    mix moves each worker by gamma times the difference of public copies, so the pair's sum is kept."""
    gen = torch.Generator().manual_seed(2)
    x = [torch.randn(1000, generator=gen) for _ in range(2)]
    codec = lambda: make_codec("topk:0.1", 1000)  # noqa: E731
    publics = [PublicCopy(codec()) for _ in range(2)]
    replicas = [ReplicaSet(codec(), lambda: torch.empty(1000)) for _ in range(2)]
    for _ in range(30):
        snapshots = []
        for i in range(2):
            delta, to_delta, keyframe, to_key = publics[i].prepare(x[i], [1 - i])
            if keyframe is not None:
                snapshots.append(replicas[1 - i].keyframe(i, keyframe.clone()))
            else:
                snapshots.append(replicas[1 - i].delta(i, delta))
        for i in range(2):
            assert torch.equal(replicas[1 - i].public(i), publics[i].public)
        before = x[0] + x[1]
        x = [choco_mix(x[i], publics[i].public, 0.5, [(0.5, snapshots[1 - i])], 0.2, torch.empty(1000))
             for i in range(2)]
        assert torch.allclose(x[0] + x[1], before, atol=1e-4)
    assert float((x[0] - x[1]).norm()) < 0.5 * float(before.norm())


def test_a_delta_before_any_keyframe_is_an_error():
    replicas = ReplicaSet(make_codec("int8", 10), lambda: torch.empty(10))
    with pytest.raises(RuntimeError, match="before any keyframe"):
        replicas.delta(3, torch.zeros(make_codec("int8", 10).payload_nbytes, dtype=torch.uint8))


def test_int4_holds_its_grid_exactly_in_half_a_byte_per_value():
    """Values on the block's grid (multiples of absmax / 7) come back exactly, odd counts included, and
    the payload is half a byte per value plus a float32 scale per block of 256."""
    grid = torch.arange(-7, 8, dtype=torch.float32) * 0.25  # absmax 1.75: the scale is 0.25
    x = torch.cat([grid, grid.flip(0), grid[:3]])  # 33 values: an odd count, one block
    codec = make_codec("int4", x.numel())
    payload = codec.encode(x)
    assert payload.numel() == 4 + 17
    assert torch.equal(codec.decode(payload), x)


def test_a_model_beside_its_momentum_goes_in_its_own_code_and_the_momentum_one_bit_a_value():
    """``head``: the model's values in int8, the rest (the outer momentum) as its signs times each
    256-block's mean magnitude, eight to a byte; an odd count, two blocks, the momentum's bytes at an
    offset that is no multiple of 4."""
    model = torch.randn(301, generator=torch.Generator().manual_seed(0))
    momentum = torch.cat([torch.full((256,), 2.0) * torch.tensor([1.0, -1.0]).repeat(128),
                          torch.tensor([0.5, -1.5, 1.0])])  # block means 2.0 and 1.0
    codec = make_codec("int8", 560, [(30, 10), (1,), (259,)], head=301)
    payload = codec.encode(torch.cat([model, momentum]))
    assert payload.numel() == codec.payload_nbytes == (2 * 4 + 301) + (2 * 4 + 33)
    decoded = codec.decode(payload)
    assert float((decoded[:301] - model).abs().max()) <= float(model.abs().max()) / 127
    expected = torch.cat([momentum[:256], torch.tensor([1.0, -1.0, 1.0])])
    assert torch.equal(decoded[301:], expected)
    assert codec.head.shapes == [(30, 10), (1,)]


def test_the_momentum_s_code_keeps_its_size_under_a_float64_default_dtype():
    """The payload's size is the receivers' buffer size: a float64 default dtype must not widen the scales
    (it did: 362 bytes where the receiver expected 354, and gloo aborted)."""
    codec = make_codec("int8", 600, head=300)
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        payload = codec.encode(torch.randn(600, dtype=torch.float64))
    finally:
        torch.set_default_dtype(saved)
    assert payload.numel() == codec.payload_nbytes == (2 * 4 + 300) + (2 * 4 + 300 // 8 + 1)


def test_a_holder_a_delta_skips_gets_a_keyframe_next_and_copies_never_drift():
    """A delta to some holders only (Hop's owed model after a repair went to the new neighbour alone) moved
    x̂ without the others: their replicas stayed off by up to 0.41 for the rest of the run, with no error."""
    codec = make_codec("int8", 100)
    sender = PublicCopy(codec)
    receivers = {d: ReplicaSet(codec, lambda: torch.empty(100)) for d in (1, 2)}
    torch.manual_seed(0)
    model = torch.randn(100)
    for step in range(30):
        model = model + 0.1 * torch.randn(100)
        dsts = [1] if step == 10 else [1, 2]  # one send to a subset
        delta, delta_dsts, keyframe, key_dsts = sender.prepare(model, dsts)
        for d in delta_dsts:
            receivers[d].delta(0, delta)
        for d in key_dsts:
            receivers[d].keyframe(0, keyframe.clone())
        if step == 11:
            assert key_dsts == [2]  # the holder the delta skipped
    for receiver in receivers.values():
        assert torch.equal(receiver.public(0), sender.public)


@pytest.mark.parametrize("spec", ["int8", "bf16"])
def test_error_feedback_keeps_a_float64_model_s_rounding_too(spec):
    """Its residual was float32: the float64 part of every push was dropped (9.4e-8 over 1,000 pushes)."""
    x = torch.randn(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    feedback = ErrorFeedback(make_codec(spec, 1000))
    transmitted = torch.zeros(1000, dtype=torch.float64)
    for _ in range(1000):
        transmitted += feedback.encode(x)[1]
    assert feedback.residual.dtype == torch.float64
    assert float((1000 * x - transmitted - feedback.residual).abs().sum()) < 1e-9


def test_a_bfloat16_model_s_start_digest_is_written():
    """Hop and D-PSGD hash the model they start from under compression; numpy has no bfloat16 (TypeError)."""
    import types

    from torch import nn

    from hetrain.runtime.flat_state import FlatState
    from hetrain.runtime.hop import Hop

    hop = object.__new__(Hop)
    hop.name, hop.state, store = "hop", FlatState(nn.Linear(4, 3).to(torch.bfloat16)), {}
    hop.job = types.SimpleNamespace(rank=0, store=types.SimpleNamespace(set=store.__setitem__))
    hop._publish_start()
    assert len(store["hetrain/hop/start-digest/0"]) == 32


@pytest.mark.parametrize("spec", ["int8", "int4", "bf16", "none"])
def test_an_empty_buffer_encodes_and_decodes_to_nothing(spec):
    codec = make_codec(spec, 0)
    payload = codec.encode(torch.zeros(0))
    assert payload.numel() == codec.payload_nbytes and codec.decode(payload).numel() == 0


@pytest.mark.parametrize("spec", ["int8", "int4"])
def test_a_non_finite_value_shows_in_its_block_and_nowhere_else(spec):
    """A NaN decoded to 0 (int8) or -8 times the scale (int4): finite values that hid it in every copy."""
    codec = make_codec(spec, 512)
    for bad in (float("nan"), float("inf")):
        x = torch.full((512,), 1e-3)
        x[3] = bad
        decoded = codec.decode(codec.encode(x))
        assert not torch.isfinite(decoded[3])
        assert torch.allclose(decoded[256:], x[256:], rtol=0.2)  # the other block as it was


def test_the_one_bit_code_returns_every_sign_and_each_block_s_mean_magnitude():
    """Every value's sign (zero as +) and its 256-block's mean magnitude, at a length no multiple of 8
    or 256 and with every byte pattern sent: a packing that carried between flags, or read the bits in
    another order, fails here."""
    generator = torch.Generator().manual_seed(5)
    patterns = ((torch.arange(256)[:, None] >> torch.arange(8)) & 1).reshape(-1)  # bytes 0..255, bit k at k
    values = torch.rand(2048 + 517, generator=generator) + 0.5
    signs = torch.cat([patterns, torch.randint(0, 2, (517,), generator=generator)]).float() * 2 - 1
    x = values * signs
    x[7] = 0.0
    codec = make_codec("int8", 2 * x.numel(), head=x.numel())  # the tail is the one-bit code
    decoded = codec.decode(codec.encode(torch.cat([x, x])))[x.numel():]
    expected_signs = torch.where(x >= 0, 1.0, -1.0)
    assert torch.equal(torch.sign(decoded), expected_signs)
    means = [chunk.abs().mean() for chunk in x.split(256)]
    expected = expected_signs * torch.cat([m.expand(len(c)) for m, c in zip(means, x.split(256))])
    assert torch.allclose(decoded, expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("spec", [*SPECS, "one-bit"])
def test_encoding_leaves_its_input_as_it_was(spec):
    """The quantizers divide and round a copy in place: at a length of whole blocks (512) the model
    being sent must come back untouched (the encoders' input is the worker's own model or its delta)."""
    x = torch.randn(1024 if spec == "one-bit" else 512, generator=torch.Generator().manual_seed(10))
    kept = x.clone()
    codec = make_codec("int8", 1024, head=512) if spec == "one-bit" else make_codec(spec, 512)
    codec.encode(x)
    assert torch.equal(x, kept)


@pytest.mark.parametrize("spec, head", [("int4", None), ("int8", 512)])
def test_the_bit_packing_codes_refuse_a_big_endian_machine(monkeypatch, spec, head):
    """Int4 and the one-bit code read their bytes as little-endian words: on a big-endian machine they
    would swap values silently, so they refuse in one line naming what to use instead."""
    import sys

    monkeypatch.setattr(sys, "byteorder", "big")
    try:
        make_codec(spec, 1024, head=head)
        refused = None
    except RuntimeError as error:
        refused = str(error)
    assert refused is not None and "little-endian words and this machine is big-endian" in refused
    make_codec("int8", 1024)  # a code that packs no bits is still made


@pytest.mark.parametrize("nonzero", [300, 1200])
def test_topk_of_a_vector_mostly_of_zeros_is_exact(nonzero, monkeypatch):
    """A sample of a vector mostly of zeros has threshold zero (both cases: the sample holds about 50 and
    200 values above zero where its threshold is its 266th largest): the values above zero are chosen
    among themselves (``nonzero`` = 1,200 > k), and where fewer than k (300) the rest are the zeros of
    lowest index, as the tie rule says. A path that took zeros from anywhere, or dropped a value, fails."""
    from hetrain.compression import codecs

    calls = []
    sparse = codecs._largest_of_sparse
    monkeypatch.setattr(codecs, "_largest_of_sparse", lambda m, k: calls.append(k) or sparse(m, k))
    numel = 400_000
    generator = torch.Generator().manual_seed(12)
    x = torch.zeros(numel)
    where = torch.randperm(numel, generator=generator)[:nonzero]
    x[where] = torch.randn(nonzero, generator=generator)
    x[where[0]] = float("nan")  # ranked first
    codec = make_codec("topk:0.0025", numel)
    assert codec.k == 1000
    sent = set(codec.encode(x)[: 4 * codec.k].view(torch.int32).tolist())
    magnitude = torch.nan_to_num(x.abs(), nan=float("inf"))
    if nonzero > codec.k:
        expected = set(torch.topk(magnitude, codec.k).indices.tolist())
    else:
        zeros = torch.nonzero(x == 0).squeeze(1)[: codec.k - nonzero]
        expected = set(where.tolist()) | set(zeros.tolist())
    assert sent == expected and len(sent) == codec.k
    assert calls == [codec.k]  # the sparse path was the one taken
