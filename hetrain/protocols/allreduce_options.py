"""All-Reduce's settings and rules: it takes no options, and a death ends the job (DDP needs everyone)."""

from __future__ import annotations

from dataclasses import dataclass

from hetrain.protocols.options import TOLERANT, OptionError, ProtocolOptions

COMPRESSIONS = ("none", "bf16", "powersgd")  # what torch ships as DDP communication hooks


@dataclass(frozen=True)
class AllReduceOptions(ProtocolOptions):
    """All-Reduce (DistributedDataParallel) takes no protocol options."""

    def default_on_failure(self) -> str:
        return "abort"

    def supports_respawn(self) -> bool:
        return False

    def check_comm(self, comm) -> None:
        """DDP averages gradients inside every backward pass: no local steps, no outer optimizer, and the
        compressions torch ships as DDP hooks (a sum of int8 or top-k messages needs an all-gather)."""
        if comm.sync_every != 1 or comm.local_work != "fixed" or comm.outer_named != "none":
            raise OptionError("allreduce (DDP) averages gradients at every step: {sync_every}, {local_work} and "
                              "{outer_optimizer} apply to hop, dpsgd, prague, adpsgd and ps")
        if comm.compression.kind not in COMPRESSIONS:
            raise OptionError(f"allreduce (DDP) compresses with torch's own hooks: {{compression}} "
                              f"{', '.join(COMPRESSIONS)}:RANK, not {comm.compression}")

    def check_on_failure(self, on_failure: str) -> None:
        if on_failure in TOLERANT:
            raise OptionError(f"allreduce cannot {on_failure} without a worker (DDP's collectives need "
                              "everyone): use {on_failure} abort, with checkpoints to restart from")
