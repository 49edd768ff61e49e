"""One worker's way to the others, as one object a protocol is given (``transport=``).

A protocol needs the job's view (group, store, device, timeout: :class:`~hetrain.transport.job.JobView`)
and who is in the job (:class:`~hetrain.transport.membership.Membership`); from those it builds its
channels, groups and emulated link. By default a protocol makes its transport from ``process_group``
and ``dead_workers`` (``Transport.of``), as torch's own averagers take a group; injecting one instead
runs the same protocol on a job the default process group knows nothing of: ``Transport.on_store``
builds a job of its own on a store, which is how ``hetrain.testing.thread_ranks`` runs several ranks
as threads of one process (the fast test tier).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hetrain.transport.job import DEFAULT_TIMEOUT_S, JobView
from hetrain.transport.membership import Membership


@dataclass(frozen=True)
class Transport:
    job: JobView
    membership: Membership | None = None  # who reports deaths (None: nobody; a job without failure handling)

    @classmethod
    def of(cls, process_group, device: torch.device, timeout_s: float, kind: str,
           dead_workers: Callable[[], set[int]] | Membership | None = None) -> Transport:
        """Today's transport: the view of ``process_group`` (None: the default group)."""
        return cls(JobView.of(process_group, device, timeout_s, kind),
                   Membership.of(dead_workers) if dead_workers is not None else None)

    @classmethod
    def on_store(cls, store, rank: int, world_size: int, kind: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 membership: Membership | None = None, device: torch.device | None = None) -> Transport:
        """A job of its own on ``store`` (gloo), with no default process group (see the module docstring)."""
        return cls(JobView.on_store(store, rank, world_size, kind, timeout_s=timeout_s, device=device), membership)
