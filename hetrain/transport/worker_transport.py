"""One worker's way to the others, as one object a protocol is given (``transport=``).

A protocol needs the job's view (group, store, device, timeout: :class:`~hetrain.transport.job.JobView`)
and who is in the job (:class:`~hetrain.transport.membership.Membership`); it asks the transport for
its emulated link (:meth:`Transport.link`) and its peer channels (:meth:`Transport.channels`), so that
a transport of another kind (a recorder, a fake) sees every message a protocol sends on them. Group
services (P-Reduce, the final average) build their communicators on the job's store with the one
constructor, :func:`~hetrain.transport.job.store_group`. By default a protocol makes its transport from ``process_group``
and ``dead_workers`` (``Transport.of``), as torch's own averagers take a group; injecting one instead
runs the same protocol on a job the default process group knows nothing of: ``Transport.on_store``
builds a job of its own on a store, which is how ``hetrain.testing.thread_ranks`` runs several ranks
as threads of one process (the fast test tier).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hetrain.transport.job import DEFAULT_TIMEOUT_S, JobView
from hetrain.transport.link import EmulatedLink
from hetrain.transport.link_spec import LinkSpec
from hetrain.transport.membership import Membership
from hetrain.transport.peer_channels import PeerChannels


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
        incarnation = membership.incarnation if membership is not None else 0
        return cls(JobView.on_store(store, rank, world_size, kind, timeout_s=timeout_s, device=device,
                                    incarnation=incarnation), membership)

    # -- what a protocol builds on it ---------------------------------------------------------
    def link(self, spec: LinkSpec | None) -> EmulatedLink:
        """This worker's emulated link (``spec`` None: unconstrained; it still counts bytes)."""
        return EmulatedLink(spec, self.job.rank)

    def channels(self, payload_numel: int, payload_dtype: torch.dtype, on_message, on_error, *,
                 on_host: bool = False, **options) -> PeerChannels:
        """Tagged point-to-point channels to this worker's peers (see :class:`PeerChannels` for ``options``);
        ``on_host``: payloads live in host memory whatever the model's device (the parameter server's)."""
        job = dataclasses.replace(self.job, device=torch.device("cpu")) if on_host else self.job
        return PeerChannels(job, payload_numel, payload_dtype, on_message, on_error, **options)
