"""What a message is compressed to: ``none``, ``bf16``, ``int8``, ``int4``, ``topk:FRACTION``, ``powersgd:RANK``.

Pure (no torch): parsing and message sizes, shared by the runtime's codecs
(:mod:`hetrain.compression.codecs`) and the simulator (which charges the sizes).

* ``bf16``: every value as bfloat16 (2 bytes).
* ``int8``: values in blocks of ``INT8_BLOCK``; each block as int8 times its own
  float32 scale (its largest magnitude / 127): 1 byte per value plus 4 per block.
* ``int4``: the same blocks, each value as a 4-bit integer in [-7, 7] times the
  block's scale (largest magnitude / 7), two values per byte: half a byte per value
  plus 4 per block (7.8x fewer bytes than float32, against int8's 3.9x).
* ``topk:F``: the ``ceil(F n)`` values of largest magnitude, as (int32 index,
  float32 value) pairs: 8 bytes each.
* ``powersgd:R``: each weight matrix (a tensor of 2+ dimensions, as rows x the
  rest) as a rank-R product P Q^T (one power iteration, warm-started from the
  previous message's Q: Vogels et al., NeurIPS'19), where that is smaller;
  vectors (biases, norms) as float32.

Every compressor loses something; what it loses is kept and sent later (error
feedback), so nothing is lost over time: the runtime's protocols send
differences from what the receivers already hold (CHOCO-SGD, Koloskova et al.
ICML'19) or carry an explicit residual (:mod:`hetrain.compression.error_feedback`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hetrain.errors import UsageError

KINDS = ("none", "bf16", "int8", "int4", "topk", "powersgd")
INT8_BLOCK = 256
_FORM = "none, bf16, int8, int4, topk:FRACTION (e.g. topk:0.01) or powersgd:RANK (e.g. powersgd:4)"


@dataclass(frozen=True)
class CompressionSpec:
    kind: str = "none"
    fraction: float = 0.0  # topk
    rank: int = 0  # powersgd

    @classmethod
    def parse(cls, text: str | CompressionSpec | None) -> CompressionSpec:
        if isinstance(text, CompressionSpec):
            return text
        spec = (text or "none").strip().lower()
        kind, sep, arg = spec.partition(":")
        if kind in ("none", "bf16", "int8", "int4"):
            if sep:
                raise UsageError(f"compression {text!r}: {kind} takes no argument; expected {_FORM}")
            return cls(kind)
        if kind == "topk":
            try:
                fraction = float(arg)
            except ValueError:
                raise UsageError(f"malformed compression {text!r}: expected {_FORM}") from None
            if not 0 < fraction < 1:
                raise UsageError(f"compression {text!r}: the fraction must be in (0, 1), e.g. topk:0.01")
            return cls("topk", fraction=fraction)
        if kind == "powersgd":
            try:
                rank = int(arg)
            except ValueError:
                raise UsageError(f"malformed compression {text!r}: expected {_FORM}") from None
            if rank < 1:
                raise UsageError(f"compression {text!r}: the rank must be >= 1, e.g. powersgd:4")
            return cls("powersgd", rank=rank)
        raise UsageError(f"unknown compression {text!r}; expected {_FORM}")

    @property
    def enabled(self) -> bool:
        return self.kind != "none"

    def __str__(self) -> str:
        if self.kind == "topk":
            return f"topk:{self.fraction:g}"
        if self.kind == "powersgd":
            return f"powersgd:{self.rank}"
        return self.kind

    def topk_count(self, numel: int) -> int:
        return max(1, min(numel, math.ceil(self.fraction * numel)))

    def payload_nbytes(self, numel: int, shapes: list[tuple] | None = None) -> int:
        """Bytes of one compressed message of ``numel`` float32 values (``shapes``: the tensors, for powersgd;
        without them the whole buffer counts as one near-square matrix)."""
        if self.kind == "none":
            return 4 * numel
        if self.kind == "bf16":
            return 2 * numel
        if self.kind == "int8":
            return numel + 4 * math.ceil(numel / INT8_BLOCK)
        if self.kind == "int4":
            return math.ceil(numel / 2) + 4 * math.ceil(numel / INT8_BLOCK)
        if self.kind == "topk":
            return 8 * self.topk_count(numel)
        shapes = shapes if shapes is not None else [_square(numel)]
        return 4 * sum(low_rank_numel(shape, self.rank) for shape in shapes)

    def default_gossip_step(self, numel: int, shapes: list[tuple] | None = None) -> float:
        """CHOCO's consensus step for these messages: 1 for the quantizers (none, bf16, int8, int4), the fraction
        of the bytes sent for topk and powersgd (a larger step diverged: docs/decisions/communication.md, "Compression")."""
        if self.kind in ("topk", "powersgd"):
            return min(1.0, 1.0 / self.ratio(numel, shapes))
        return 1.0

    def ratio(self, numel: int, shapes: list[tuple] | None = None) -> float:
        """Uncompressed float32 bytes over compressed bytes."""
        return 4 * numel / self.payload_nbytes(numel, shapes)


def matrix_of(shape: tuple) -> tuple[int, int] | None:
    """(rows, columns) a tensor of ``shape`` is compressed as, or None for a vector or scalar."""
    if len(shape) < 2:
        return None
    rows = int(shape[0])
    return rows, int(math.prod(shape)) // max(1, rows)


def low_rank_numel(shape: tuple, rank: int) -> int:
    """Values sent for one tensor under powersgd:``rank``: P and Q where that is smaller, else the tensor."""
    numel = int(math.prod(shape)) if shape else 1
    matrix = matrix_of(shape)
    if matrix is None:
        return numel
    rows, cols = matrix
    r = min(rank, rows, cols)
    return (rows + cols) * r if (rows + cols) * r < numel else numel


def _square(numel: int) -> tuple[int, int]:
    rows = max(1, int(math.isqrt(numel)))
    return rows, math.ceil(numel / rows)
