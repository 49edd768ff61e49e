"""Hop's and D-PSGD's settings and the checks that reject deadlock-prone or meaningless combinations.

Two names: :class:`HopOptions` / :class:`DPSGDOptions` are what a user passes
(Python arguments, CLI flags; the one carrier of the protocol's settings), and
:class:`HopConfig` is the complete setting the logic runs with, which
``options.config_for(topology)`` derives (defaults filled in for the graph,
then :meth:`HopConfig.validated_for` the graph).
"""

from __future__ import annotations

from dataclasses import dataclass

from hetrain.protocols.options import OptionError, ProtocolOptions, option
from hetrain.topology import Topology, make_topology

TOPOLOGY_HELP = ("dpsgd/hop graph: ring, double_ring, torus, hypercube, exponential, complete, "
                 "or an edge-list file (SRC DST per line); default ring")

# Defaults of the `hop` protocol when the user leaves a setting out (docs/decisions/hop-defaults.md):
HOP_DEFAULT_STALENESS = 1
HOP_DEFAULT_MAX_IG = 8  # > a 5x straggler's lead: its neighbours are not throttled within one of its iterations
HOP_DEFAULT_SKIP_THRESHOLD = 2
LATE_UPDATES = ("model", "progress")  # docs/decisions/hop-late-updates-progress.md


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
    late_updates: how an update older than the iteration it is averaged into is mixed: "model" (as the
        model it is, Hop's rule) or "progress" (averaged, and the worker's own steps since put back:
        :mod:`hetrain.protocols.lag_compensation`).
    """

    backup: int = 0
    staleness: int = 0
    max_ig: int | None = None
    skip_threshold: int | None = None
    late_updates: str = "model"

    @property
    def uses_tokens(self) -> bool:
        return self.max_ig is not None

    def validated_for(self, topology: Topology) -> HopConfig:
        """This config made complete and deadlock-free for ``topology``, or OptionError saying why not.

        Token queues are switched on (max_ig = HOP_DEFAULT_MAX_IG) whenever backup workers,
        staleness or skipping are used, since then the graph no longer bounds the gap.
        """
        min_in = min(len(n) for n in topology.in_neighbors) if topology.num_workers > 1 else 0
        if self.backup < 0 or self.staleness < 0:
            raise OptionError("{backup} and {staleness} must be >= 0")
        if self.backup and self.backup >= min_in:
            raise OptionError(
                f"{{backup}} {self.backup} must be fewer than every worker's in-neighbours (the {topology.name} "
                f"graph has a worker with {min_in}); a worker that waits for nobody never mixes -- use a smaller "
                "{backup} or a denser {topology}"
            )
        max_ig = self.max_ig
        needs_tokens = self.backup > 0 or self.staleness > 0 or self.skip_threshold is not None
        if max_ig is None and needs_tokens:
            max_ig = max(HOP_DEFAULT_MAX_IG, self.staleness + 1, (self.skip_threshold or 0) + 2)
        if max_ig is not None and max_ig < 1:
            raise OptionError(f"{{max_ig}} must be >= 1 (a worker with no token can never start), got {max_ig}")
        if self.skip_threshold is not None:
            if self.skip_threshold < 1:
                raise OptionError(f"{{skip_threshold}} must be >= 1, got {self.skip_threshold}")
            if self.skip_threshold > max_ig - 2:
                raise OptionError(
                    f"{{skip_threshold}} {self.skip_threshold} must be at most {{max_ig}} minus 2 ({max_ig - 2}): "
                    "when a worker finishes an iteration, tokens have kept its neighbours within max_ig - 2 "
                    "iterations of its next one, so it would never skip; raise {max_ig} or lower the threshold"
                )
        if self.late_updates not in LATE_UPDATES:
            raise OptionError(f"{{late_updates}} must be one of {', '.join(LATE_UPDATES)}, got {self.late_updates!r}")
        return HopConfig(self.backup, self.staleness, max_ig, self.skip_threshold, self.late_updates)


@dataclass(frozen=True)
class HopOptions(ProtocolOptions):
    """Hop's arguments (None: Hop's default for the topology, see :meth:`config_for`).

    ``topology`` is a graph's name or edge-list file, or a built :class:`~hetrain.topology.Topology`.
    """

    topology: str | Topology = option("ring", type=str, help=TOPOLOGY_HELP)
    backup: int | None = option(help="hop: backup workers b (default 1 where every worker has 2+ in-neighbours)")
    staleness: int | None = option(help="hop: bounded staleness s (default 1); ps: asynchronous with staleness s "
                                        "(default 0: synchronous)")
    max_ig: int | None = option(help="hop: tokens per edge, the largest iteration gap (default 8)")
    skip_threshold: int | None = option(help="hop: skip iterations when every in-neighbour is this far ahead "
                                             "(default 2; 0 switches skipping off)")
    late_updates: str = option("model", type=str, choices=LATE_UPDATES,
                               help="hop: an update older than the iteration is averaged as the model it is "
                                    "(default model, Hop's rule: it pulls the worker back by the steps taken "
                                    "since) or with those steps put back (progress; docs/decisions/hop-late-updates-progress.md)")

    def topology_for(self, num_workers: int) -> Topology:
        """The graph over ``num_workers`` (a given Topology as it is)."""
        return self.topology if isinstance(self.topology, Topology) else make_topology(self.topology, num_workers)

    def resolve(self, num_workers: int) -> tuple[Topology, HopConfig]:
        """The graph and the complete, deadlock-free settings; OptionError saying why not."""
        topology = self.topology_for(num_workers)
        return topology, self.config_for(topology)

    def config_for(self, topology: Topology) -> HopConfig:
        """Hop's settings with its defaults filled in, validated for ``topology``.

        Left out (None): backup 1 where every worker has at least 2 in-neighbours (else 0),
        staleness 1, max_ig 8, skip_threshold 2. ``skip_threshold=0`` switches skipping off.
        """
        for name in ("backup", "staleness", "skip_threshold"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise OptionError(f"{{{name}}} must be >= 0, got {value}")
        if self.max_ig is not None and self.max_ig < 1:
            raise OptionError(f"{{max_ig}} must be >= 1 (each edge needs at least one token), got {self.max_ig}")
        min_in = min((len(n) for n in topology.in_neighbors), default=0)
        backup = self.backup if self.backup is not None else (1 if min_in >= 2 else 0)
        staleness = self.staleness if self.staleness is not None else HOP_DEFAULT_STALENESS
        max_ig = self.max_ig if self.max_ig is not None else HOP_DEFAULT_MAX_IG
        skip_threshold = (self.skip_threshold if self.skip_threshold is not None
                          else min(HOP_DEFAULT_SKIP_THRESHOLD, max_ig - 2))
        return HopConfig(backup, staleness, max_ig, skip_threshold or None,
                         self.late_updates).validated_for(topology)

    def validate(self, num_workers: int) -> HopOptions:
        self.resolve(num_workers)
        return self

    def check_comm(self, comm) -> None:
        if self.late_updates == "progress" and comm.compression.enabled:
            raise OptionError("{late_updates} progress puts back the steps an old model would undo, and "
                              "compressed gossip mixes public copies instead of models: use {late_updates} "
                              "model with --compress, or no compression")


@dataclass(frozen=True)
class DPSGDOptions(ProtocolOptions):
    """D-PSGD's arguments: the graph only (every iteration waits for every in-neighbour)."""

    topology: str | Topology = option("ring", type=str, help=TOPOLOGY_HELP)

    def topology_for(self, num_workers: int) -> Topology:
        return self.topology if isinstance(self.topology, Topology) else make_topology(self.topology, num_workers)

    def resolve(self, num_workers: int) -> tuple[Topology, HopConfig]:
        topology = self.topology_for(num_workers)
        return topology, self.config_for(topology)

    def config_for(self, topology: Topology) -> HopConfig:
        return HopConfig()

    def validate(self, num_workers: int) -> DPSGDOptions:
        self.resolve(num_workers)
        return self
