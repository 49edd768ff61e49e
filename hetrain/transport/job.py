"""A protocol's view of its job: the process group (default: the world), its store, device and timeout.

Protocols follow torch's own averagers: they take ``process_group=None``
(the default group) and work out the rest. :class:`JobView` is that rest:
this worker's rank and the group's size, the device the model lives on, the
timeout that bounds every wait, the node layout (torchrun's ``LOCAL_RANK`` /
``LOCAL_WORLD_SIZE``), and a store namespace of its own on the job's c10d
store (for services such as Prague's Group Generator and for the
communicators a protocol builds).
"""

from __future__ import annotations

import datetime
import os
import time
import uuid
from dataclasses import dataclass
from itertools import count

import torch
import torch.distributed as dist

from hetrain.errors import WorkerError

DEFAULT_TIMEOUT_S = 60.0
_instances: dict[tuple, count] = {}


def job_store():
    """The job's c10d store (the default group's), under the prefix ``hetrain/``.

    PyTorch has no public accessor for the default group's store; this wraps the
    one private call in one place. None when unavailable (services that need a
    store then say so).
    """
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return dist.PrefixStore("hetrain/", _get_default_store())
    except Exception:  # pragma: no cover - the private API moved
        return None


GLOO_LAZY_ENV = "TORCH_GLOO_LAZY_INIT"


def prefer_lazy_connections() -> None:
    """Let gloo connect a pair of ranks on their first message, not every pair when a group is made.

    A decentralized worker talks to a few neighbours; eagerly, each world-sized
    group costs it a connection to every other rank (docs/decisions/gloo-connects-lazily.md). An explicit ``TORCH_GLOO_LAZY_INIT`` in the environment wins.
    """
    os.environ.setdefault(GLOO_LAZY_ENV, "1")


def init(backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, device: str | None = None) -> torch.device:
    """Join the job torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, ...); return this worker's device.

    Initialises the default process group if needed (NCCL when CUDA is available,
    else gloo, unless ``backend`` says) and, with NCCL, selects ``LOCAL_RANK``'s GPU.
    ``device="cuda"`` with gloo puts the model on a GPU too (``LOCAL_RANK`` modulo the GPUs:
    several ranks may share one) and moves tensors through the host to communicate.

    It imports ``torch._dynamo`` first. Imported after the default group exists (the first
    optimizer a script creates imports it), it takes 10 references to that group (torch 2.13), so
    ``destroy_process_group()`` cannot free it: its gloo threads outlive Python's finalization, and
    one that drops a tensor then aborts the process ("terminate called without an active
    exception"; the example under torchrun: 1 run in 4-20, docs/decisions/local-job-processes.md).
    """
    prefer_lazy_connections()
    if not dist.is_initialized():
        import torch._dynamo  # noqa: F401 (before the group: see above)

        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        timeout = datetime.timedelta(seconds=timeout_s)
        store = _attempt_store(timeout)
        if store is None:
            dist.init_process_group(backend, timeout=timeout)
        else:
            dist.init_process_group(backend, store=store, rank=int(os.environ["RANK"]),
                                    world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)
    if dist.get_backend() == "nccl" or device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
        return select_gpu(local_rank)
    return torch.device("cpu")


def select_gpu(rank: int) -> torch.device:
    """This process's GPU: ``rank`` modulo the GPUs (NCCL jobs are refused more ranks than GPUs before
    they start), made the current device so that threads and kernels default to it."""
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def _attempt_store(timeout: datetime.timedelta):
    """Under torchrun with its agent's store (torch's default since 2.5), that store under a prefix of
    this attempt's own; None otherwise (``init_process_group``'s own).

    The agent keeps one store across ``--max-restarts`` restarts, and a restarted job's ranks read
    the dead attempt's addresses from it: gloo then connects to ports nobody listens on and the
    restart fails (pytorch/pytorch#135712; seen here with hop under torchrun, a rank SIGKILLed
    mid-run). The prefix cannot be ``TORCHELASTIC_RESTART_COUNT``: each agent counts its own restarts,
    and an agent started for a lost node counts from 0 while the survivors are at 1 or more, so their
    ranks would wait under different prefixes. The ranks agree on it through the store instead
    (:func:`agree_on_attempt`).
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_ADDR" not in os.environ:
        return None
    agent = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timeout)
    token = agree_on_attempt(agent, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), timeout.total_seconds())
    return dist.PrefixStore(f"hetrain/attempt-{token}/", agent)


ATTEMPT_KEY = "hetrain/attempt"
_POLL_S = 0.05  # how often a rank looks for rank 0's answer
_REREAD_S = 0.5  # how often it reads the attempt's token again (it may have read a dead attempt's)


def agree_on_attempt(store, rank: int, world_size: int, timeout_s: float) -> str:
    """A token of this attempt's own, the same on every rank, through a store that outlives attempts.

    The store may hold a dead attempt's token. Rank 0 publishes a fresh one; every other rank answers
    the token it reads with a nonce of its own and takes the token once rank 0 has echoed that nonce.
    Only a live rank 0, this attempt's, echoes a nonce made now: a rank that read a dead attempt's token
    reads it again until it finds the fresh one. Raises ``WorkerError`` after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    if rank == 0:
        token = uuid.uuid4().hex
        store.set(ATTEMPT_KEY, token)
        joined = [f"{ATTEMPT_KEY}/{token}/joined/{r}" for r in range(1, world_size)]
        if joined:
            try:
                store.wait(joined, datetime.timedelta(seconds=timeout_s))
            except dist.DistStoreError:
                message = f"rank 0: not every rank of this torchrun attempt joined within {timeout_s:.0f} s"
                raise WorkerError(message) from None
            for r, nonce in zip(range(1, world_size), store.multi_get(joined)):
                store.set(f"{ATTEMPT_KEY}/{token}/welcome/{r}/{nonce.decode()}", b"1")
        return token
    nonce, token, read_at = uuid.uuid4().hex, None, -_REREAD_S
    while True:
        if time.monotonic() - read_at >= _REREAD_S:
            current = store.get(ATTEMPT_KEY).decode()  # waits for the first attempt's rank 0 to set it
            read_at = time.monotonic()
            if current != token:
                token = current
                store.set(f"{ATTEMPT_KEY}/{token}/joined/{rank}", nonce)
        if store.check([f"{ATTEMPT_KEY}/{token}/welcome/{rank}/{nonce}"]):
            return token
        if time.monotonic() > deadline:
            raise WorkerError(f"rank {rank}: no rank 0 of this torchrun attempt answered within {timeout_s:.0f} s")
        time.sleep(_POLL_S)


@dataclass(frozen=True)
class JobView:
    group: object  # the torch.distributed process group (None: the default group)
    rank: int  # this worker's rank in ``group``
    world_size: int
    device: torch.device
    timeout_s: float
    store: object  # a namespace of the job's store for this protocol instance (None: one worker, no store)
    local_rank: int = 0
    local_world_size: int = 1
    backend: str = "gloo"  # the group's: nccl, or gloo (also for CUDA models: tensors travel through the host)
    private: bool = False  # ``group`` was built on the store (JobView.on_store): collectives call it directly

    @classmethod
    def of(cls, process_group, device: torch.device, timeout_s: float, kind: str) -> JobView:
        """The view of ``process_group`` (None: the default group) for a protocol instance of ``kind``.

        Every member builds its protocol instances in the same order, so the n-th
        instance of a kind on a group gets the same store namespace on every member.
        """
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if not dist.is_initialized():
            return cls(process_group, 0, 1, device, timeout_s, None)
        rank, size = dist.get_rank(process_group), dist.get_world_size(process_group)
        if rank < 0:
            raise ValueError(f"worker {dist.get_rank()} built a protocol on a process group it is not in")
        ranks = tuple(dist.get_process_group_ranks(process_group)) if process_group is not None else ()
        key = (kind, ranks, rank)
        instance = next(_instances.setdefault(key, count()))
        group_tag = "world" if not ranks else "g" + "-".join(map(str, ranks))
        base = job_store()
        store = dist.PrefixStore(f"{kind}/{group_tag}/{instance}/", base) if base is not None else None
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", size))
        local_rank = int(os.environ.get("LOCAL_RANK", rank % max(1, local_world)))
        backend = str(dist.get_backend(process_group)).lower()
        return cls(process_group, rank, size, device, timeout_s, store, local_rank, local_world, backend)

    @classmethod
    def on_store(cls, store, rank: int, world_size: int, kind: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 device: torch.device | None = None, incarnation: int = 0) -> JobView:
        """A job of ``world_size`` members on ``store`` alone, with no default process group: its world group
        is built on the store (gloo). Ranks may be threads of one process (``hetrain.testing.thread_ranks``),
        each with its own view; instances of ``kind`` are numbered per rank and process (``incarnation``: a
        replacement counts from 0 again, as a new process does), as on a process group."""
        instance = next(_instances.setdefault((kind, ("store", id(store)), rank, incarnation), count()))
        group = store_group(dist.PrefixStore("world/", store), rank, world_size, timeout_s)
        namespace = dist.PrefixStore(f"{kind}/store/{instance}/", store)
        return cls(group, rank, world_size, device or torch.device("cpu"), timeout_s, namespace,
                   local_world_size=world_size, local_rank=rank, private=True)

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout_s)

    def all_reduce(self, tensor: torch.Tensor, op=dist.ReduceOp.SUM):
        """An all-reduce over the job's group, started (wait on the returned work, with a timeout)."""
        if self.private:
            options = dist.AllreduceOptions()
            options.reduceOp = op
            return self.group.allreduce([tensor], options)
        return dist.all_reduce(tensor, op=op, group=self.group, async_op=True)

    def broadcast(self, tensor: torch.Tensor, root: int = 0):
        """Member ``root``'s ``tensor`` to every member, started (wait on the returned work)."""
        if self.private:
            options = dist.BroadcastOptions()
            options.rootRank = root
            return self.group.broadcast([tensor], options)
        src = dist.get_global_rank(self.group, root) if self.group is not None else root
        return dist.broadcast(tensor, src=src, group=self.group, async_op=True)

    @property
    def multi_node(self) -> bool:
        return self.local_world_size < self.world_size

    @property
    def nccl(self) -> bool:
        return self.backend == "nccl"

    @property
    def wire_device(self) -> torch.device:
        """Where tensors must be to be sent over the job's backend: the GPU under NCCL, else the host
        (gloo's point-to-point and all-gather take CPU tensors only)."""
        return self.device if self.nccl else torch.device("cpu")


def model_device(model: torch.nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")


def store_group(store, index: int, size: int, timeout_s: float, *, nccl: bool = False):
    """The one way hetrain builds a process group: ``size`` members on ``store`` (a PrefixStore naming the
    group), this process at ``index``, NCCL or gloo, with the job's timeout. Built directly on the store,
    so only the members take part (no collective on the world); every member calls it with the same
    store prefix at the same point."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if nccl:
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout  # torch-private; the constructor takes no timeout otherwise
        return dist.ProcessGroupNCCL(store, index, size, options)
    return dist.ProcessGroupGloo(store, index, size, timeout)


def private_group(job: JobView, name: str, timeout_s: float | None = None, *, cpu: bool = False):
    """A process group of the job's members built directly on the store (no collective on the world).

    Used for point-to-point channels and servers: p2p with fixed tags on a group
    that also runs collectives can be matched against a collective's messages.
    Every member calls it with the same ``name`` at the same point. NCCL when the
    job's backend is, unless ``cpu`` (gloo, for CPU tensors).
    """
    return store_group(dist.PrefixStore(f"{name}/", job.store), job.rank, job.world_size,
                       timeout_s or job.timeout_s, nccl=job.nccl and not cpu)


def pair_group(job: JobView, name: str, peer: int, incarnations: tuple[int, int], *, cpu: bool = False):
    """A two-member group of this worker and ``peer``, named by both ranks and their incarnations.

    After a replacement joins (``respawn``), its neighbours cannot reach it over
    groups built before it started (their pairs to its rank are broken and never
    reconnect), so each pair that involves a replaced worker gets a group of its
    own. ``incarnations``: (this worker's, the peer's). Returns the group; this
    worker's index in it is 0 when its rank is the lower one.
    """
    lo, hi = sorted((job.rank, peer))
    inc = dict(zip((job.rank, peer), incarnations))
    store = dist.PrefixStore(f"{name}/pair/{lo}-{hi}/{inc[lo]}-{inc[hi]}/", job.store)
    return store_group(store, 0 if job.rank == lo else 1, 2, job.timeout_s, nccl=job.nccl and not cpu)


def subset_group(job: JobView, members: list[int], prefix: str, timeout_s: float | None = None, *,
                 nccl: bool = False):
    """A group of ``members`` (ranks of the job, this one among them) on the store under ``prefix``."""
    return store_group(dist.PrefixStore(prefix, job.store), members.index(job.rank), len(members),
                       timeout_s or job.timeout_s, nccl=nccl)
