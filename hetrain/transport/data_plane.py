"""Where model payloads travel: beside the control plane, in an order both sides take from it.

:class:`~hetrain.transport.peer_channels.PeerChannels` sends every header, and every message without
a payload (tokens, stops, the start-up handshake), over gloo on the host: the control plane, whose
tags match reliably and whose waits time out with an error. A payload follows its header on the
data plane. The sender posts it together with its header (one peer's posts are serialized by its
send window); the receiver posts the payload's receive only once the header has arrived, from the
one thread that reads that peer's headers. So each pair's payloads are received in the order they
were sent whatever the backend does with tags (NCCL ignores them), and no receive on the data plane
waits for a payload not yet posted: the long waits, for a peer's next message, are the control
plane's.

Three layouts (``HETRAIN_DATA_PLANE`` or ``layout=`` chooses; ``shared`` by default, on every job):

- ``shared``: payloads go over the control plane's own route (gloo) under a tag of their own, so a CPU
  job makes no connection beyond the control plane's (start-up cost unchanged). A GPU model's payloads
  travel through pinned host buffers (:mod:`hetrain.transport.staging`): correct by construction, and
  checked with one GPU (``scripts/gpu-check``).
- ``split``: two gloo groups, one for payloads to higher ranks and one for payloads to lower ranks:
  NCCL's layout (below), run over gloo so the tests run its code every day.
- ``nccl``: the split layout over NCCL, payloads as GPU tensors. An explicit opt-in on NCCL jobs only:
  it has not yet run on two GPUs. NCCL runs a pair's operations of one communicator on one stream, in
  posting order: with one group, two workers that each send a large model to the other and then post
  the receive each queue the receive behind a send that waits for it (a deadlock above NCCL's buffer
  size); with a group per direction each stream carries one direction. Its works are waited for by
  polling (:class:`~hetrain.transport.device_thread.StreamWork`), never on the compute stream.

A pair in which either side is a replacement (``respawn``, gloo only) uses the control route.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from hetrain.errors import UsageError
from hetrain.transport.device_thread import StreamWork
from hetrain.transport.job import JobView, private_group

LAYOUT_ENV = "HETRAIN_DATA_PLANE"
LAYOUTS = ("shared", "split", "nccl")
PAYLOAD_TAG = 14  # shared layout: payloads beside the headers' tags on the control route


def data_plane_layout(job: JobView, layout: str | None = None) -> str:
    """``layout``, else ``HETRAIN_DATA_PLANE``, else ``shared`` (every job: NCCL payloads are an opt-in)."""
    layout = layout or os.environ.get(LAYOUT_ENV) or "shared"
    if layout not in LAYOUTS:
        raise UsageError(f"{LAYOUT_ENV}={layout!r} is not a data plane layout: use one of {', '.join(LAYOUTS)}")
    if layout == "nccl" and not job.nccl:
        raise UsageError(f"{LAYOUT_ENV}=nccl sends payloads over NCCL, but this job's backend is {job.backend}: "
                         f"unset {LAYOUT_ENV}, or run with --backend nccl")
    return layout


class DataPlane:
    """Payload sends and receives for ``job``'s peer channels named ``name``.

    ``control_route(peer, incarnation)`` gives the control plane's (group, index) to reach ``peer``'s
    process ``incarnation``; ``incarnation`` is this process's own. Every member builds its data plane
    at the same point (the split and nccl layouts create two groups of the job's members)."""

    def __init__(self, job: JobView, name: str, control_route: Callable[[int, int | None], tuple[object, int]],
                 timeout_s: float, *, incarnation: int = 0, layout: str | None = None):
        self.job = job
        self.layout = data_plane_layout(job, layout)
        self._control_route = control_route
        self._incarnation = incarnation
        self._upward = self._downward = None
        self.on_stream = self.layout == "nccl"  # works on a CUDA stream: waited for by polling
        if self.layout != "shared" and incarnation == 0 and job.world_size > 1:
            cpu = not self.on_stream  # split: gloo; nccl: the job's NCCL
            self._upward = private_group(job, f"{name}-data-up", timeout_s, cpu=cpu)
            self._downward = private_group(job, f"{name}-data-down", timeout_s, cpu=cpu)

    @property
    def splits(self) -> bool:
        """Whether payloads travel on groups of their own, one per direction (split, nccl)."""
        return self.layout != "shared"

    def device(self) -> torch.device:
        """Where payloads must be to travel: the GPU with the nccl layout, else the host."""
        return self.job.device if self.on_stream else torch.device("cpu")

    def _route(self, peer: int, incarnation: int | None, sending: bool) -> tuple[object, int, int]:
        """(group, peer's index, tag) for a payload to (``sending``) or from ``peer``."""
        if self._upward is None or self._incarnation > 0 or (incarnation or 0) > 0:
            group, index = self._control_route(peer, incarnation)
            return group, index, PAYLOAD_TAG
        towards_higher = self.job.rank < peer if sending else peer < self.job.rank
        return (self._upward if towards_higher else self._downward), peer, 0

    def _check_device(self, payload: torch.Tensor, peer: int) -> None:
        if payload.device != self.device():  # gloo would read a GPU pointer as host memory; NCCL refuses
            raise UsageError(f"worker {self.job.rank}: a payload for worker {peer} is on {payload.device}, but "
                             f"this job's {self.job.backend} messages travel on {self.device()}")

    def send(self, payload: torch.Tensor, dst: int, incarnation: int | None = None):
        """Post ``payload`` to ``dst`` (after or with its header); returns the work."""
        self._check_device(payload, dst)
        group, index, tag = self._route(dst, incarnation, sending=True)
        return self._work(group.send([payload], index, tag), f"a payload to worker {dst}")

    def recv(self, payload: torch.Tensor, src: int, incarnation: int | None = None):
        """Post the receive of ``src``'s next payload into ``payload`` (only once its header arrived)."""
        self._check_device(payload, src)
        group, index, tag = self._route(src, incarnation, sending=False)
        return self._work(group.recv([payload], index, tag), f"a payload from worker {src}")

    def _work(self, work, what: str):
        return StreamWork(work, what) if self.on_stream else work

    def close(self) -> None:
        self._upward = self._downward = None
