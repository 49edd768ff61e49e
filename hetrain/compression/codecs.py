"""Compressors for flat model buffers: a message is one uint8 tensor (:mod:`hetrain.compression.spec`).

    codec = make_codec("int8", numel=flat.numel())
    payload = codec.encode(flat)            # uint8, codec.payload_nbytes bytes
    approx = codec.decode(payload)          # float32, flat's length

Every codec is deterministic: the same input gives the same bytes on every
worker (the receivers of a gossip message reconstruct what its sender
reconstructs). ``encode`` may keep state between calls (PowerSGD warm-starts
from its previous Q); ``decode`` keeps none.
"""

from __future__ import annotations

import math
import sys

import torch

from hetrain.compression.spec import INT8_BLOCK, CompressionSpec, low_rank_numel, matrix_of

_F32 = torch.float32
# byte -> its eight signs (+1 where bit k is set, else -1), bit k at column k: ScaledSign's decoder
_SIGNS_OF_BYTE = ((torch.arange(256)[:, None] >> torch.arange(8)) & 1).to(_F32) * 2 - 1
# byte -> its two int4 values (low half first), each -8..7: Int4's decoder
_INT4_PAIR_OF_BYTE = torch.stack([torch.arange(256) & 0x0F, torch.arange(256) >> 4], dim=1).to(_F32) - 8.0

_TABLES_ON_DEVICES: dict[tuple[int, torch.device], torch.Tensor] = {}


def _table_on(table: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A decoding table on ``device``, copied there once (not at every decode)."""
    if table.device == device:
        return table
    key = (id(table), device)
    if key not in _TABLES_ON_DEVICES:
        _TABLES_ON_DEVICES[key] = table.to(device)
    return _TABLES_ON_DEVICES[key]


def _require_little_endian(code: str) -> None:
    """Int4's and the one-bit code's packing reads bytes as little-endian words; refuse elsewhere."""
    if sys.byteorder != "little":
        raise RuntimeError(f"{code} packs values as little-endian words and this machine is {sys.byteorder}-endian: "
                           "use --compress int8, bf16, topk or powersgd with --outer-optimizer none")


def _as_bytes(*tensors: torch.Tensor) -> torch.Tensor:
    return torch.cat([t.contiguous().view(torch.uint8).reshape(-1) for t in tensors])


class Codec:
    """Base: ``encode(x) -> uint8 payload``, ``decode(payload) -> float32`` of ``numel`` values."""

    def __init__(self, spec: CompressionSpec, numel: int, shapes: list[tuple] | None = None):
        self.spec = spec
        self.numel = numel
        self.shapes = shapes
        self.payload_nbytes = spec.payload_nbytes(numel, shapes)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def decode(self, payload: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def add_decoded(self, payload: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out += decode(payload)``, in place (``out``'s dtype kept); returns ``out``."""
        return out.add_(self.decode(payload))

    def empty_payload(self, device) -> torch.Tensor:
        return torch.empty(self.payload_nbytes, dtype=torch.uint8, device=device)


class Identity(Codec):
    def encode(self, x):
        return _as_bytes(x.reshape(-1).to(_F32))

    def decode(self, payload):
        return payload.view(_F32).clone()


class BFloat16(Codec):
    def encode(self, x):
        return _as_bytes(x.reshape(-1).to(torch.bfloat16))

    def decode(self, payload):
        return payload.view(torch.bfloat16).to(_F32)


def _quantize_blocks(x: torch.Tensor, numel: int, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(scales, integers): ``x`` in blocks of INT8_BLOCK, each as integers in [-levels, levels] times its
    block's scale (largest magnitude / levels), rounded to nearest; the integers as float32, ``numel`` long."""
    x = x.reshape(-1).to(_F32)
    blocks = math.ceil(numel / INT8_BLOCK)
    padded = torch.empty(blocks * INT8_BLOCK, dtype=_F32, device=x.device)  # a copy: divided in place below
    padded[:numel] = x
    padded[numel:] = 0.0
    padded = padded.view(blocks, INT8_BLOCK)
    scale = padded.abs().amax(dim=1) / float(levels)
    # an all-zero block needs a scale; a non-finite one keeps it, so its block decodes non-finite (NaN
    # became 0, or -8 for int4: finite values that hid it)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return scale, padded.div_(scale[:, None]).round_().clamp_(-levels, levels).reshape(-1)[:numel]


def _dequantize_blocks(scale: torch.Tensor, q: torch.Tensor, numel: int) -> torch.Tensor:
    """The inverse of :func:`_quantize_blocks`: ``q`` (float32 integers, ``numel`` long, the caller's to
    overwrite) times its block's scale, in place."""
    return _times_block_scales(q, scale)


def _times_block_scales(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``values`` (float32, one block per INT8_BLOCK values, the last maybe shorter) times its block's
    ``scale``, in place: no padded copy (a third of a decode's time at 25M values)."""
    if scale.numel() == 0:  # no values
        return values
    full = (scale.numel() - 1) * INT8_BLOCK
    values[:full].view(-1, INT8_BLOCK).mul_(scale[:-1, None])
    values[full:].mul_(scale[-1])
    return values


class Int8(Codec):
    """Blocks of INT8_BLOCK values, each int8 times its own scale (absmax / 127), rounded to nearest."""

    def encode(self, x):
        scale, q = _quantize_blocks(x, self.numel, 127)
        return _as_bytes(scale, q.to(torch.int8))

    def decode(self, payload):
        blocks = math.ceil(self.numel / INT8_BLOCK)
        q = payload[4 * blocks:].view(torch.int8).to(_F32)  # a copy: scaled in place
        return _dequantize_blocks(payload[: 4 * blocks].view(_F32), q, self.numel)


class Int4(Codec):
    """Blocks of INT8_BLOCK values, each a 4-bit integer in [-7, 7] times its block's scale (absmax / 7),
    rounded to nearest; two per byte (the even value in the low half). The scales come first."""

    def __init__(self, spec, numel, shapes=None):
        _require_little_endian("--compress int4")
        super().__init__(spec, numel, shapes)

    def encode(self, x):
        scale, q = _quantize_blocks(x, self.numel, 7)
        q = q.add_(8).to(torch.uint8)  # 1..15: a nibble each
        if q.numel() % 2:
            q = torch.nn.functional.pad(q, (0, 1), value=8)
        # two bytes as one little-endian word: the even value in bits 0-3, the odd in bits 8-11
        words = q.view(torch.int16)
        return _as_bytes(scale, ((words & 0x0F) | ((words >> 4) & 0xF0)).to(torch.uint8))

    def decode(self, payload):
        blocks = math.ceil(self.numel / INT8_BLOCK)
        q = _table_on(_INT4_PAIR_OF_BYTE, payload.device)[payload[4 * blocks:].long()].reshape(-1)[: self.numel]
        return _dequantize_blocks(payload[: 4 * blocks].view(_F32), q, self.numel)


class TopK(Codec):
    """The ``k`` values of largest magnitude as (int32 index, float32 value), by index; ties at the k-th
    magnitude go to the lowest indices, and a NaN ranks above every number."""

    def __init__(self, spec, numel, shapes=None):
        super().__init__(spec, numel, shapes)
        self.k = spec.topk_count(numel)

    def encode(self, x):
        x = x.reshape(-1).to(_F32)
        index, _ = torch.sort(_largest_magnitudes(x.abs(), self.k))  # the same bytes whatever order topk returns
        return _as_bytes(index.to(torch.int32), x[index])

    def decode(self, payload):
        index = payload[: 4 * self.k].view(torch.int32).long()
        values = payload[4 * self.k:].view(_F32)
        out = torch.zeros(self.numel, dtype=_F32, device=payload.device)
        out[index] = values
        return out


def _largest_magnitudes(magnitude: torch.Tensor, k: int, sample_size: int = 65536) -> torch.Tensor:
    """The indices of ``magnitude``'s ``k`` largest values (unordered): every value above the k-th
    largest, then the lowest indices among those equal to it; a NaN ranks above every number.

    ``torch.topk`` over every value takes 0.4-0.6 s at 25M values on one core, and breaks ties as
    it likes. Above ``2 * sample_size`` values, a strided sample's quantile gives a threshold that
    about 1.5 k values pass; the choice among those alone is exact whenever at least ``k`` pass (the
    ``k`` largest, and every value tied with the k-th, are then all among them), else (a sample the
    vector's structure misled) it is made over the whole vector: 2.4-4.6x faster here either way
    on random data. Where the threshold is zero (a vector mostly of zeros), see :func:`_largest_of_sparse`."""
    numel = magnitude.numel()
    candidates = None
    if numel // sample_size >= 2:
        sample = magnitude[:: numel // sample_size]
        rank = min(sample.numel(), math.ceil(1.5 * k * sample.numel() / numel) + 16)
        threshold = torch.topk(sample, rank, sorted=False).values.min()
        if threshold == 0:
            return _largest_of_sparse(magnitude, k)
        # not below it: a NaN passes too (and a NaN threshold lets every value through)
        candidates = torch.nonzero(torch.logical_not(magnitude < threshold)).squeeze(1)
        if candidates.numel() < k:
            candidates = None
    values = torch.nan_to_num(magnitude if candidates is None else magnitude[candidates], nan=math.inf)
    kth = torch.topk(values, k, sorted=False).values.min()
    above = torch.nonzero(values > kth).squeeze(1)
    tied = torch.nonzero(values == kth).squeeze(1)[: k - above.numel()]  # nonzero's order: lowest first
    chosen = torch.cat([above, tied])
    return chosen if candidates is None else candidates[chosen]


def _largest_of_sparse(magnitude: torch.Tensor, k: int) -> torch.Tensor:
    """:func:`_largest_magnitudes` where a sample's threshold is zero: "not below zero" would pass every
    value (2M values, 99.75% zeros: twice the time of a plain ``torch.topk``). The choice is made among
    the values above zero (and NaNs); if fewer than ``k``, the rest are the zeros of lowest index, all
    among the first ``k`` + (values above zero) indices."""
    nonzero = torch.nonzero(torch.logical_not(magnitude <= 0)).squeeze(1)  # a NaN is not <= 0
    if nonzero.numel() >= k:
        return nonzero[_largest_magnitudes(magnitude[nonzero], k)]
    prefix = magnitude[: k + nonzero.numel()]
    zeros = torch.nonzero(prefix == 0).squeeze(1)[: k - nonzero.numel()]
    return torch.cat([nonzero, zeros])


class PowerSGD(Codec):
    """Each matrix M (rows x rest) as P Q^T: P = orth(M Q_prev), Q = M^T P, Q_prev kept for the next call."""

    def __init__(self, spec, numel, shapes=None):
        shapes = [tuple(s) for s in (shapes or [(numel,)])]
        if sum(math.prod(s) if s else 1 for s in shapes) != numel:
            raise ValueError(f"powersgd: the shapes hold {sum(math.prod(s) for s in shapes)} values, not {numel}")
        super().__init__(spec, numel, shapes)
        self._plan = []  # (offset, numel, (rows, cols, rank) or None)
        offset = 0
        for shape in shapes:
            count = math.prod(shape) if shape else 1
            matrix = matrix_of(shape)
            low = matrix is not None and low_rank_numel(shape, spec.rank) < count
            self._plan.append((offset, count, (*matrix, min(spec.rank, *matrix)) if low else None))
            offset += count
        self._q: dict[int, torch.Tensor] = {}

    def _initial_q(self, index: int, cols: int, rank: int, device) -> torch.Tensor:
        generator = torch.Generator().manual_seed(1234 + index)
        return torch.randn(cols, rank, generator=generator, dtype=_F32).to(device)

    def encode(self, x):
        x = x.reshape(-1).to(_F32)
        parts = []
        for index, (offset, count, low) in enumerate(self._plan):
            piece = x[offset: offset + count]
            if low is None:
                parts.append(piece)
                continue
            rows, cols, rank = low
            m = piece.view(rows, cols)
            q = self._q.get(index)
            if q is None:
                q = self._initial_q(index, cols, rank, x.device)
            p = torch.linalg.qr(m @ q).Q  # rows x rank, orthonormal columns
            q = m.t() @ p  # cols x rank: M ~ P Q^T
            self._q[index] = q
            parts += [p.reshape(-1), q.reshape(-1)]
        return _as_bytes(torch.cat(parts))

    def decode(self, payload):
        values = payload.view(_F32)
        out = torch.empty(self.numel, dtype=_F32, device=payload.device)
        at = 0
        for offset, count, low in self._plan:
            if low is None:
                out[offset: offset + count] = values[at: at + count]
                at += count
                continue
            rows, cols, rank = low
            p = values[at: at + rows * rank].view(rows, rank)
            at += rows * rank
            q = values[at: at + cols * rank].view(cols, rank)
            at += cols * rank
            out[offset: offset + count] = (p @ q.t()).reshape(-1)
        return out


class ScaledSign(Codec):
    """One bit a value: blocks of INT8_BLOCK values, each its sign times the block's mean magnitude
    (scaled sign, as in EF-SignSGD: Karimireddy et al., ICML'19; what it drops goes out with later
    messages, see :mod:`hetrain.compression.gossip_codec`). The scales first, then eight signs a byte.
    Not a ``--compress`` choice: the code of the outer momentum that travels beside a compressed model."""

    def __init__(self, spec, numel, shapes=None):
        _require_little_endian("the one-bit code of the outer optimizer's state")
        self.spec, self.numel, self.shapes = spec, numel, shapes
        self.blocks = math.ceil(numel / INT8_BLOCK)
        self.payload_nbytes = 4 * self.blocks + math.ceil(numel / 8)

    def encode(self, x):
        x = x.reshape(-1).to(_F32)
        counts = torch.full((self.blocks,), float(INT8_BLOCK), dtype=_F32, device=x.device)  # not the default dtype
        counts[-1] = self.numel - (self.blocks - 1) * INT8_BLOCK
        magnitude = x.abs()
        full = (self.blocks - 1) * INT8_BLOCK
        sums = torch.cat([magnitude[:full].view(-1, INT8_BLOCK).sum(1), magnitude[full:].sum().view(1)])
        nonneg = (x >= 0).view(torch.uint8)
        if self.numel % 8:  # the last byte's spare bits read "non-negative", as zero padding would
            nonneg = torch.nn.functional.pad(nonneg, (0, 8 - self.numel % 8), value=1)
        # eight flags (0 or 1, flag k in byte k of a little-endian word) into one byte, flag k in bit k:
        # the multiply moves flag k to bit 56 + k with no carries into the top byte
        words = nonneg.view(torch.int64)
        packed = ((words * 0x0102040810204080) >> 56) & 0xFF
        return _as_bytes(sums / counts, packed.to(torch.uint8))

    def decode(self, payload):
        scale = payload[: 4 * self.blocks].clone().view(_F32)  # a slice of a larger payload may sit unaligned
        signs = _table_on(_SIGNS_OF_BYTE, payload.device)[payload[4 * self.blocks:].long()].reshape(-1)[: self.numel]
        return _times_block_scales(signs, scale)


class Split(Codec):
    """The first ``head.numel`` values with ``head``, the rest with ``tail``: one payload, head's bytes first."""

    def __init__(self, head: Codec, tail: Codec):
        self.head, self.tail = head, tail
        self.spec, self.shapes = head.spec, head.shapes
        self.numel = head.numel + tail.numel
        self.payload_nbytes = head.payload_nbytes + tail.payload_nbytes

    def encode(self, x):
        x = x.reshape(-1)
        return torch.cat([self.head.encode(x[: self.head.numel]), self.tail.encode(x[self.head.numel:])])

    def decode(self, payload):
        cut = self.head.payload_nbytes
        return torch.cat([self.head.decode(payload[:cut]), self.tail.decode(payload[cut:])])

    def add_decoded(self, payload, out):
        """Each part added to its slice of ``out``: no concatenated copy (200 MB at 50M values)."""
        cut = self.head.payload_nbytes
        self.head.add_decoded(payload[:cut], out[: self.head.numel])
        self.tail.add_decoded(payload[cut:], out[self.head.numel:])
        return out


_CODECS = {"none": Identity, "bf16": BFloat16, "int8": Int8, "int4": Int4, "topk": TopK, "powersgd": PowerSGD}


def make_codec(spec: str | CompressionSpec, numel: int, shapes: list[tuple] | None = None,
               head: int | None = None) -> Codec:
    """The codec of ``spec`` for flat buffers of ``numel`` values (``shapes``: their tensors, for powersgd).

    ``head``: where a buffer's first ``head`` values are a model and the rest what travels beside it (Hop
    and D-PSGD: the outer momentum of an outer SGD with momentum; Prague and AD-PSGD: the outer
    optimizer's anchors), the model goes with ``spec`` and the rest one bit a value
    (:class:`ScaledSign`); ``head`` = ``numel`` or None: all of it with ``spec``.
    """
    spec = CompressionSpec.parse(spec)
    if head is None or head >= numel:
        return _CODECS[spec.kind](spec, numel, shapes)
    head_shapes = None
    if shapes is not None:  # the model's tensors: those that sum to ``head``
        head_shapes, count = [], 0
        for shape in shapes:
            if count >= head:
                break
            head_shapes.append(shape)
            count += math.prod(shape) if shape else 1
    return Split(_CODECS[spec.kind](spec, head, head_shapes), ScaledSign(spec, numel - head))
