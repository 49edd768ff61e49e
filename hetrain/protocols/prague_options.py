"""Prague's settings and rules: the Group Generator mode, the group size, sharding, and what a death does.

:class:`PragueOptions` is the one carrier of Prague's settings (CLI flags,
Python arguments, the simulator); :func:`scheduler_for` builds the Group
Generator those settings ask for (sharded or not).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hetrain.protocols.comm_budget import cache_entries, check_comm_memory, comm_memory_option
from hetrain.protocols.gg_modes import GG_MODES
from hetrain.protocols.group_generator import GroupGenerator, validate_gg
from hetrain.protocols.options import TOLERANT, OptionError, ProtocolOptions, check_at_least, option
from hetrain.protocols.sharded_gg import ShardedGroupGenerator, check_sharding


@dataclass(frozen=True)
class PragueOptions(ProtocolOptions):
    """Prague's arguments: the Group Generator mode, the group size, the communicator cache."""

    gg: str = option("smart", type=str, choices=GG_MODES,
                     help="prague: Group Generator mode (default smart: heterogeneity-aware)")
    group_size: int = option(2, help="prague: P-Reduce group size s (default 2, see docs/concepts/prague.md)")
    communicator_cache: int = option(60, help="prague/adpsgd: communicators kept per worker (default 60)")
    comm_memory_mb: int = comm_memory_option()
    workers_per_node: int | None = option(help="prague: node size for the node-aware static schedule")
    gg_prefetch_ms: float = option(5.0, type=float,
                                   help="prague: ask the Group Generator this many ms before the compute is "
                                        "expected to end, hiding the round trip (default 5; 0: ask after it)")
    gg_shards: int = option(1, help="prague: Group Generators, each over a shard of the workers redrawn every "
                                    "--gg-epoch-s (default 1: one for the job; docs/concepts/prague.md)")
    gg_epoch_s: float = option(1.0, type=float, help="prague: seconds between redraws of the shards (default 1)")
    preduce_overlap: int = option(1, choices=(0, 1),
                                  help="prague: 1 runs each step's P-Reduces while the next step computes, "
                                       "applying the average one step late (default 1; 0: block on them; "
                                       "docs/concepts/prague.md)")

    def validate(self, num_workers: int) -> PragueOptions:
        validate_gg(num_workers, self.group_size, self.gg, self.communicator_cache, self.workers_per_node)
        check_at_least("gg_prefetch_ms", self.gg_prefetch_ms, 0)
        check_comm_memory(self.comm_memory_mb)
        if self.gg_shards != 1:
            check_sharding(num_workers, self.group_size, self.gg, self.gg_shards, self.gg_epoch_s)
        return self

    @property
    def local_schedule(self) -> bool:
        """Whether every worker computes its groups itself (the static schedule): no Group Generator to ask."""
        return self.gg == "static"

    caches_member_sets = True

    def fit_memory(self, flat_nbytes: int, *, compressed: bool, nccl: bool, num_workers: int | None = None) -> PragueOptions:
        entries = cache_entries(self.communicator_cache, self.comm_memory_mb, flat_nbytes,
                                self.largest_group(num_workers), compressed=compressed, nccl=nccl)
        return self if entries == self.communicator_cache else dataclasses.replace(self, communicator_cache=entries)

    def largest_group(self, num_workers: int | None) -> int:
        """The most members a group may have: ``group_size``, except for the static schedule by node, whose
        groups are a node's workers and one worker of each node (``workers_per_node`` and the nodes)."""
        per_node = self.workers_per_node
        if self.local_schedule and per_node and num_workers and per_node < num_workers:
            return max(self.group_size, per_node, num_workers // per_node)
        return self.group_size

    def default_on_failure(self) -> str:
        return "abort" if self.local_schedule else "continue"  # no Group Generator to stop grouping the dead

    def check_comm(self, comm) -> None:
        if self.local_schedule and comm.local_work == "auto":
            raise OptionError("the static schedule runs every worker's groups at the same exchange, and "
                              "{local_work} auto gives workers different local steps: use a Group Generator "
                              "mode ({gg} smart, random, buffer or division) or {local_work} fixed")

    def supports_respawn(self) -> bool:
        return not self.local_schedule and self.gg_shards == 1  # one Group Generator re-admits a replacement

    def check_on_failure(self, on_failure: str) -> None:
        if on_failure in TOLERANT and self.local_schedule:
            raise OptionError("the static schedule has no Group Generator to route around a death: use "
                              "{on_failure} abort, or another {gg} mode")
        if on_failure == "respawn" and self.gg_shards > 1:
            raise OptionError("respawn needs one Group Generator (a replacement is re-admitted by it): use "
                              "{gg_shards} 1, or {on_failure} continue")

    def scheduler_endpoints(self) -> int:
        return max(1, self.gg_shards)


def scheduler_for(num_workers: int, options: PragueOptions, seed: int = 0):
    """Prague's Group Generator for ``options`` (every mode; ``static`` computes its schedule locally)."""
    options.validate(num_workers)
    if options.gg_shards > 1:
        return ShardedGroupGenerator(num_workers, options.group_size, options.gg, shards=options.gg_shards,
                                     epoch_s=options.gg_epoch_s, seed=seed, cache_size=options.communicator_cache)
    return GroupGenerator(num_workers, options.group_size, options.gg, seed=seed,
                          workers_per_node=options.workers_per_node, cache_size=options.communicator_cache)
