"""How many member sets a worker's communicator cache may keep: a bound in bytes, as an entry count.

Each member set in a worker's cache (:mod:`hetrain.protocols.comm_lru`) holds a communicator and, with
compression, ``group size`` public copies of the model (:mod:`hetrain.compression.preduce_compressed`).
On a GPU both are device memory: 60 cached sets (the default ``communicator_cache``) of a compressed
400 MB model in groups of 2 would be 48 GB, and 60 NCCL communicators several more. ``comm_memory_mb``
bounds what the cache's sets hold; :func:`cache_entries` turns it into the entry count that every
worker's cache and the Group Generator's mirror of it use (they must agree: the GG replays each
worker's evictions), computed from the same inputs everywhere (the model's flat size, the group size,
compression, the backend). A model that cannot fit one set is refused in one line.

Pure: no torch.
"""

from __future__ import annotations

from hetrain.protocols.options import OptionError, option

MB = 2**20
DEFAULT_COMM_MEMORY_MB = 4096
# What one NCCL communicator of a small group holds on the GPU, estimated (NCCL's buffers, 4 MiB per
# channel and protocol, times its channels): not measured here (no GPU was at hand); set high on purpose.
NCCL_COMMUNICATOR_MB = 128


def comm_memory_option():
    """The ``comm_memory_mb`` field of every protocol that caches member sets (one help text)."""
    return option(DEFAULT_COMM_MEMORY_MB,
                  help="prague/adpsgd: memory (MB) a worker's cached member sets may hold: compressed P-Reduce's "
                       f"public copies (group size x the model each) and NCCL communicators (about "
                       f"{NCCL_COMMUNICATOR_MB} MB each, estimated); the communicator cache keeps what fits "
                       f"(default {DEFAULT_COMM_MEMORY_MB})")


def check_comm_memory(budget_mb: int) -> None:
    if budget_mb < 1:
        raise OptionError(f"{{comm_memory_mb}} must be >= 1, got {budget_mb}")


def set_nbytes(flat_nbytes: int, group_size: int, *, compressed: bool, nccl: bool) -> int:
    """Bytes one cached member set holds: ``group_size`` copies of the flat model when ``compressed``,
    plus an NCCL communicator's estimated size on ``nccl``."""
    return (group_size * flat_nbytes if compressed else 0) + (NCCL_COMMUNICATOR_MB * MB if nccl else 0)


def cache_entries(cap: int, budget_mb: int, flat_nbytes: int, group_size: int, *, compressed: bool,
                  nccl: bool) -> int:
    """The member sets a cache keeps: at most ``cap`` (``communicator_cache``), and at most what fits in
    ``budget_mb`` (``comm_memory_mb``). OptionError when not even one set fits."""
    check_comm_memory(budget_mb)
    per_set = set_nbytes(flat_nbytes, group_size, compressed=compressed, nccl=nccl)
    if per_set == 0:  # gloo without compression: a communicator's few sockets
        return cap
    fits = budget_mb * MB // per_set
    if fits < 1:
        raise OptionError(f"one member set keeps {_describe(flat_nbytes, group_size, compressed, nccl)}, "
                          f"more than {{comm_memory_mb}} {budget_mb}: raise it to {-(-per_set // MB)} or more"
                          + (", or use {compression} none" if compressed else ""))
    return min(cap, fits)


def _describe(flat_nbytes: int, group_size: int, compressed: bool, nccl: bool) -> str:
    parts = []
    if compressed:
        parts.append(f"{group_size} x the {_mb(flat_nbytes)} model ({_mb(group_size * flat_nbytes)})")
    if nccl:
        parts.append(f"an NCCL communicator (about {NCCL_COMMUNICATOR_MB} MB)")
    return " and ".join(parts)


def _mb(nbytes: int) -> str:
    return f"{nbytes / MB:.0f} MB" if nbytes >= MB else f"{nbytes / MB:.2f} MB"
