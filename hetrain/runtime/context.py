"""What a protocol needs to know about the job it runs in."""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 60.0


@dataclass
class WorkerContext:
    """One worker's place in the job.

    ``timeout_s`` bounds every blocking wait of the protocols: a wait that runs
    past it raises :class:`hetrain.errors.WorkerError` naming the worker and
    what it waited for. ``store`` is the job's c10d store (used by services such
    as Prague's Group Generator). ``local_rank``/``local_world_size`` describe
    the node, for node-aware schedules.
    """

    rank: int
    world_size: int
    device: torch.device
    timeout_s: float = DEFAULT_TIMEOUT_S
    store: object | None = None
    local_rank: int = 0
    local_world_size: int = 1
    report: Callable[[object], None] | None = None  # send a message to the launcher (local jobs only)
    stop_requested: Callable[[], bool] | None = None  # True once the launcher asks to stop (Ctrl-C)

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout_s)

    @property
    def node(self) -> int:
        return self.rank // max(1, self.local_world_size)


def init_from_env(backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> WorkerContext:
    """Join the job described by torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...).

    Initialises the default process group if it is not initialised yet (gloo on
    CPU, NCCL when CUDA is available unless ``backend`` says otherwise) and
    returns the worker's :class:`WorkerContext`.
    """
    if not dist.is_initialized():
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if dist.get_backend() == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    store = _default_store()
    return WorkerContext(rank, world, device, timeout_s, store, local_rank, local_world)


def _default_store():
    """The default group's store, wrapped in a prefix so keys do not collide with c10d's."""
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return dist.PrefixStore("hetrain/", _get_default_store())
    except Exception:  # pragma: no cover - private API moved; services needing a store will say so
        return None
