"""When a CPU P-Reduce averages by a direct exchange instead of a ring all-reduce (pure; runtime and simulator).

A direct exchange sends the buffer to every other member at once: one message
latency, (s-1) x buffer bytes in and out per member. gloo's ring all-reduce
takes 2(s-1) latencies in sequence and moves 2(s-1)/s x buffer. Small buffers
are latency-bound, so they go direct; measured on loopback (see
``docs/benchmarks-prague.md``): 20 KB among 3 workers 0.37 ms direct vs 2.5 ms
ring, 512 KB 0.7 vs 2.8 ms; around 1 MB the two are level, and the ring wins
from 2-4 MB.
"""

from __future__ import annotations

DIRECT_MAX_BYTES = 1 << 19  # buffers up to this size go direct...
DIRECT_RECEIVE_FACTOR = 8  # ...while (s-1) x buffer stays within this many times the limit


def uses_direct_exchange(nbytes: float, group_size: int, max_bytes: int = DIRECT_MAX_BYTES) -> bool:
    """True when a group of ``group_size`` averages ``nbytes`` per member by a direct exchange."""
    return nbytes <= max_bytes and (group_size - 1) * nbytes <= DIRECT_RECEIVE_FACTOR * max_bytes
