"""Hop's settings and the checks that reject deadlock-prone or meaningless combinations."""

from __future__ import annotations

from dataclasses import dataclass

from hetrain.errors import UsageError
from hetrain.topology import Topology

DEFAULT_MAX_IG = 4


@dataclass(frozen=True)
class HopConfig:
    """Hop (queue-based decentralized training) settings.

    backup: b -- proceed once updates from all but b in-neighbours are held.
    staleness: s -- at iteration k an update of iteration k' >= k - s may be used.
    max_ig: tokens per edge -- no worker starts more than max_ig iterations ahead of an
        out-neighbour's completed iterations; None means no token queues (plain D-PSGD,
        where the graph itself bounds the gap).
    skip_threshold: J -- a worker whose in-neighbours' updates are >= J iterations ahead
        jumps to their iteration (for deterministically slow workers); None disables it.
    """

    backup: int = 0
    staleness: int = 0
    max_ig: int | None = None
    skip_threshold: int | None = None

    @property
    def uses_tokens(self) -> bool:
        return self.max_ig is not None


def validate_hop_config(config: HopConfig, topology: Topology) -> HopConfig:
    """Return a complete, deadlock-free config for ``topology`` or raise UsageError saying why.

    Token queues are switched on (max_ig = DEFAULT_MAX_IG) whenever backup workers,
    staleness or skipping are used, since then the graph no longer bounds the gap.
    """
    min_in = min(len(n) for n in topology.in_neighbors) if topology.num_workers > 1 else 0
    if config.backup < 0 or config.staleness < 0:
        raise UsageError("--backup and --staleness must be >= 0")
    if config.backup and config.backup >= min_in:
        raise UsageError(
            f"--backup {config.backup} must be fewer than every worker's in-neighbours (the {topology.name} "
            f"graph has a worker with {min_in}); a worker that waits for nobody never mixes -- use a smaller "
            "--backup or a denser --topology"
        )
    max_ig = config.max_ig
    needs_tokens = config.backup > 0 or config.staleness > 0 or config.skip_threshold is not None
    if max_ig is None and needs_tokens:
        max_ig = max(DEFAULT_MAX_IG, config.staleness + 1, config.skip_threshold or 0)
    if max_ig is not None and max_ig < 1:
        raise UsageError(f"--max-ig must be >= 1 (a worker with no token can never start), got {max_ig}")
    if config.skip_threshold is not None:
        if config.skip_threshold < 1:
            raise UsageError(f"--skip-threshold must be >= 1, got {config.skip_threshold}")
        if config.skip_threshold > max_ig:
            raise UsageError(
                f"--skip-threshold {config.skip_threshold} exceeds --max-ig {max_ig}: tokens stop every "
                "neighbour before it gets that far ahead, so no worker would ever skip; use a threshold <= max-ig"
            )
    return HopConfig(config.backup, config.staleness, max_ig, config.skip_threshold)
