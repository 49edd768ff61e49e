"""All-Reduce's settings and rules: it takes no options, and a death ends the job (DDP needs everyone)."""

from __future__ import annotations

from dataclasses import dataclass

from hetrain.protocols.options import TOLERANT, OptionError, ProtocolOptions


@dataclass(frozen=True)
class AllReduceOptions(ProtocolOptions):
    """All-Reduce (DistributedDataParallel) takes no protocol options."""

    def default_on_failure(self) -> str:
        return "abort"

    def supports_respawn(self) -> bool:
        return False

    def check_on_failure(self, on_failure: str) -> None:
        if on_failure in TOLERANT:
            raise OptionError(f"allreduce cannot {on_failure} without a worker (DDP's collectives need "
                              "everyone): use {on_failure} abort, with checkpoints to restart from")
