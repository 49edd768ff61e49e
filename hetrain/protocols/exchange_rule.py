"""When a CPU P-Reduce averages by a direct exchange instead of a ring all-reduce (pure; runtime and simulator).

A direct exchange sends the buffer to every other member at once: one message
latency, (s-1) x buffer bytes in and out per member. gloo's ring all-reduce
takes 2(s-1) latencies in sequence and moves 2(s-1)/s x buffer. Small buffers
are latency-bound, so they go direct; large ones go round the ring. Where the
limits below come from, measured: ``docs/results/2026-11-30-preduce-direct-exchange.md``, "Where the
direct exchange pays".
"""

from __future__ import annotations

DIRECT_MAX_BYTES = 1 << 19  # buffers up to this size go direct...
DIRECT_RECEIVE_FACTOR = 8  # ...while (s-1) x buffer stays within this many times the limit


def uses_direct_exchange(nbytes: float, group_size: int, max_bytes: int = DIRECT_MAX_BYTES) -> bool:
    """True when a group of ``group_size`` averages ``nbytes`` per member by a direct exchange."""
    return nbytes <= max_bytes and (group_size - 1) * nbytes <= DIRECT_RECEIVE_FACTOR * max_bytes
