"""AD-PSGD (Lian et al., ICML'18) as a baseline: atomic pairwise averaging, active/passive split.

After each local step an active (even-rank) worker averages its model with a
random passive (odd-rank) worker; a passive worker, at each of its syncs,
serves the pairs actives queued for it, one after another. The pairing is pure
logic (:mod:`hetrain.protocols.adpsgd_pairing`), served beside rank 0 like
Prague's GG; each pair runs as a P-Reduce of two. As in Prague, the local step
comes before the averaging (the paper overlaps them; the averaging is the same).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hetrain.comm.settings import CommSettings
from hetrain.compression.spec import CompressionSpec
from hetrain.protocols.adpsgd_pairing import ADPSGDOptions, scheduler_for
from hetrain.protocols.options import options_or_settings
from hetrain.runtime.prague import GroupProtocol, _nccl, fit_to_memory
from hetrain.runtime.protocol import comm_from
from hetrain.runtime.public_signature import document_settings, keywords_given
from hetrain.transport.job import DEFAULT_TIMEOUT_S
from hetrain.transport.link_spec import LinkSpec


class ADPSGD(GroupProtocol):
    """AD-PSGD: actives (even ranks) average with a random passive (odd rank) after each step.

    Its settings are :class:`~hetrain.protocols.adpsgd_pairing.ADPSGDOptions`' fields, by keyword or as
    ``options=``; ``seed``: the pairing's random draws (the same on every worker).

    Example::

        with hetrain.ADPSGD(model, optimizer) as sync:
            for x, y in loader:
                optimizer.zero_grad(); loss_fn(model(x), y).backward(); optimizer.step()
    """

    name = "adpsgd"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                 communicator_cache: int = ADPSGDOptions.communicator_cache,
                 comm_memory_mb: int = ADPSGDOptions.comm_memory_mb,
                 sync_every: int = CommSettings.sync_every, local_work: str = CommSettings.local_work,
                 outer_optimizer: str | torch.optim.Optimizer = CommSettings.outer_optimizer,
                 outer_lr: float | None = CommSettings.outer_lr, outer_momentum: float | None = CommSettings.outer_momentum,
                 compression: str | CompressionSpec = CommSettings.compression,
                 gossip_step: float | None = CommSettings.gossip_step, link_mbps: str | None = CommSettings.link_mbps,
                 link_latency_ms: str | None = CommSettings.link_latency_ms, link: LinkSpec | str | float | None = None,
                 options: ADPSGDOptions | None = None, comm: CommSettings | None = None, seed: int = 0,
                 process_group=None, timeout_s: float = DEFAULT_TIMEOUT_S, on_failure: str = "abort",
                 dead_workers=None, gg_address: tuple[str, str] | None = None, transport=None):
        settings = keywords_given(locals(), ADPSGDOptions)
        comm = comm_from(comm, settings, "ADPSGD")
        options = options_or_settings(ADPSGDOptions, options, settings, "ADPSGD")
        fitted = fit_to_memory(options, model, comm, transport.job.nccl if transport is not None else
                               _nccl(process_group))  # the cache sized to comm_memory_mb
        world = transport.job.world_size if transport is not None else \
            dist.get_world_size(process_group) if dist.is_initialized() else 1
        scheduler = scheduler_for(world, fitted, seed)
        super().__init__(model, optimizer, scheduler, communicator_cache=fitted.communicator_cache,
                         local_scheduler=False, process_group=process_group, timeout_s=timeout_s,
                         on_failure=on_failure, dead_workers=dead_workers, gg_address=gg_address, options=options,
                         comm=comm, transport=transport)
        self.stats.extra["role"] = "active" if scheduler.is_active(self.job.rank) else "passive"


document_settings(ADPSGD, ADPSGDOptions)
