"""P-Reduce: average a flat buffer across a group of workers (Prague's Partial All-Reduce).

Usable on its own::

    import torch.distributed as dist
    from hetrain import PReduce

    dist.init_process_group("gloo", ...)          # or nccl; every worker
    preduce = PReduce(cache_size=60, timeout_s=60)
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    preduce(flat, members=(0, 2, 3))              # called by workers 0, 2 and 3 only
    torch.nn.utils.vector_to_parameters(flat, model.parameters())

A communicator is created by the group's members alone, the first time the
member set is used, and kept in a bounded LRU cache keyed by member set. It is
built directly on the job's store (``ProcessGroupGloo`` / ``ProcessGroupNCCL``
under a prefix that names the member set and the creation), not with
``dist.new_group``: with ``use_local_synchronization=True`` new_group hashes
the ranks *and the number of groups this process already holds* into the
group's name, so members holding different numbers of cached groups would
rendezvous under different names and hang. One operation per call (the
buffer is flat: one collective, or one exchange, below), a group of one is a no-op.

How a CPU (gloo) group averages: small buffers by a *direct exchange*, every
member sends its buffer to every other member at once and sums the group's
buffers in member order (one message latency; gloo's ring needs 2(s-1)
latencies in sequence), larger ones by gloo's ring all-reduce. Direct when the
buffer is at most ``direct_max_bytes`` (default 512 KiB) and the bytes
received, (s-1) x buffer, at most 8 x that (the rule and its measurements:
:mod:`hetrain.protocols.exchange_rule`); both give every member bit-identical
results.
NCCL groups always use the all-reduce. Under gloo a GPU buffer is averaged
through a host copy (gloo's point-to-point and all-gather take CPU tensors).

Emulated links and compression: with ``link`` (an
:class:`~hetrain.transport.link.EmulatedLink`) every call counts the bytes this
member sends and receives and holds it for the time the emulated links take;
with ``codec`` a member set's later calls send compressed differences from
public copies the members keep (:mod:`hetrain.compression.preduce_compressed`).
``weight`` (every member passes its own) makes the average weighted.

Eviction must happen at the same point on every member. Inside Prague the
Group Generator passes ``comm_id`` (it replays each worker's cache, see
:mod:`hetrain.protocols.comm_lru`). Standalone callers that omit ``comm_id`` must
either keep ``cache_size`` at least the number of member sets they use, or
issue groups in an order on which every member's cache evicts the same sets.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from hetrain.compression.codecs import Codec
from hetrain.compression.preduce_compressed import GroupReplicas, compressed_exchange
from hetrain.errors import UsageError, WorkerError
from hetrain.protocols.comm_lru import CommunicatorLRU
from hetrain.protocols.exchange_rule import DIRECT_MAX_BYTES, uses_direct_exchange
from hetrain.protocols.options import OptionError
from hetrain.transport.device_thread import wait_work
from hetrain.transport.job import job_store, store_group
from hetrain.transport.link import EmulatedLink
from hetrain.transport.link_spec import ring_allreduce_bytes
from hetrain.transport.membership import CONFIRM_DEATH_S
from hetrain.transport.watched_call import DeathDuringCall, call_unless_dead

_DIAGNOSE_GRACE_S = 2.0  # how long a timed-out member waits for the others' arrival marks
_EXCHANGE_TAG = 0
_DEATH_POLL_S = 0.05


class MemberDied(WorkerError):
    """A P-Reduce gave up because a member of its group is dead (continue mode: skip the group)."""

    def __init__(self, rank: int, members: tuple, dead: list[int]):
        super().__init__(f"worker {rank}: P-Reduce on group {list(members)} abandoned: worker(s) {dead} died")
        self.members, self.dead = members, dead


class PReduce:
    """Average ``buf`` in place across ``members``; see the module docstring.

    ``store`` is the job's c10d store (default: the default group's store),
    ``rank`` this worker's global rank (default: ``dist.get_rank()``).
    ``namespace`` prefixes the store keys of its communicators: two PReduce
    objects in one job need different namespaces (the same on every member).
    ``direct_max_bytes`` is the largest buffer averaged by a direct exchange
    instead of the ring all-reduce (0: always the all-reduce); every member
    must use the same value.
    ``is_dead(rank)``, when given (continue mode), lets a call give up at once on a
    group with a dead member instead of waiting out the timeout; the buffer is then
    left as it was (every reduction works on a copy and writes back only on success).
    Counters: ``hits``, ``misses``, ``evictions``, ``calls``.
    """

    def __init__(
        self,
        store=None,
        rank: int | None = None,
        *,
        cache_size: int = 60,
        timeout_s: float = 60.0,
        namespace: str = "preduce",
        direct_max_bytes: int = DIRECT_MAX_BYTES,
        is_dead: Callable[[int], bool] | None = None,
        link: EmulatedLink | None = None,
        codec: Codec | None = None,
        gossip_step: float = 1.0,
        backend: str | None = None,
    ):
        if cache_size < 1:
            raise OptionError(f"{{cache_size}} must be >= 1, got {cache_size}")
        if store is None:
            store = job_store()
            if store is None:
                raise UsageError("P-Reduce needs the job's c10d store; pass store=...")
        self.store = store
        self.rank = dist.get_rank() if rank is None else rank
        self.timeout_s = timeout_s
        self.namespace = namespace
        self.direct_max_bytes = direct_max_bytes
        self.is_dead = is_dead
        self.backend = (backend or (str(dist.get_backend()) if dist.is_initialized() else "gloo")).lower()
        self._nccl: set[tuple] = set()  # keys of NCCL communicators (shut down when evicted)
        self.cache = CommunicatorLRU(cache_size)
        self._comms: dict[tuple, object] = {}
        self._uses: dict[tuple, int] = {}
        self._generation: dict[tuple, int] = {}
        self.link = link if link is not None else EmulatedLink(None, self.rank)
        self.codec = codec
        self.gossip_step = gossip_step
        self._replicas: dict[tuple, GroupReplicas] = {}  # compression: each cached member set's public copies
        self.hits = self.misses = self.evictions = self.calls = 0
        self.compressed_calls = 0
        self.uncompressed_bytes = self.compressed_bytes = 0  # what this member sent, and its float32 size
        self.replica_bytes_peak = 0  # compression: the most bytes of public copies held at once

    def __call__(self, buf: torch.Tensor, members, comm_id: int | None = None, fresh=(),
                 weight: float | None = None) -> torch.Tensor:
        """Replace ``buf`` (a flat tensor) by its average over ``members``; return it.

        ``fresh``: members whose buffer does not count (replacements that hold no model yet: they
        receive the others' average); every member must pass the same, and not all members.
        ``weight``: this member's weight in a weighted average (every member passes one, or none does).
        """
        members = tuple(sorted(set(int(m) for m in members)))
        if self.rank not in members:
            raise UsageError(f"worker {self.rank} called P-Reduce on group {list(members)} it is not in")
        if len(members) == 1:
            return buf
        if buf.is_cuda and self.backend != "nccl":  # gloo: through a host copy
            host = buf.cpu()
            self(host, members, comm_id, fresh, weight)
            return buf.copy_(host)
        comm_key = self._lookup(members, comm_id, buf)
        uses = self._uses[comm_key]
        self._uses[comm_key] = uses + 1
        self.calls += 1
        work_buf = buf.clone() if self.is_dead is not None else buf  # continue mode: commit only on success
        try:
            if comm_key not in self._comms:
                self._comms[comm_key] = self._create_watching(members, comm_key, buf)
            comm, timeout = self._comms[comm_key], datetime.timedelta(seconds=self.timeout_s)
            index, size = members.index(self.rank), len(members)
            replicas = self._replicas.get(comm_key) if not fresh else None
            if replicas is not None:
                sent = self._watching(members, lambda: compressed_exchange(
                    comm, work_buf, index, size, self.codec, replicas, self.gossip_step, weight,
                    lambda work: self._wait(work, timeout, members)))
                self.compressed_calls += 1
                self.link.collective(members, (size - 1) * sent, (size - 1) * sent, size - 1)
                self._count(self._plain_bytes(buf, size), (size - 1) * sent)
            else:
                self._average(comm, work_buf, members, index, timeout, fresh, weight)
                if self.codec is not None:  # the set's copies start from the average every member now holds
                    self._replicas[comm_key] = GroupReplicas(work_buf, size)
                    self.replica_bytes_peak = max(self.replica_bytes_peak, self.replica_bytes)
        except MemberDied as exc:
            self._comms.pop(comm_key, None)  # abandoned mid-call: never used again (the GG drops the dead)
            self._replicas.pop(comm_key, None)
            raise exc from None
        except Exception as exc:  # gloo/NCCL raise RuntimeError on timeouts and lost peers
            dead = self._dead_members(members, grace_s=CONFIRM_DEATH_S)
            if dead:
                raise MemberDied(self.rank, members, dead) from None
            missing = self._diagnose(members, comm_key, uses)
            raise WorkerError(
                f"worker {self.rank}: P-Reduce on group {list(members)} failed after waiting up to "
                f"{self.timeout_s:.0f} s; members that did not arrive: {missing or 'unknown'} ({exc})"
            ) from None
        if work_buf is not buf:
            buf.copy_(work_buf)
        return buf

    def _average(self, comm, work_buf: torch.Tensor, members: tuple, index: int, timeout, fresh, weight) -> None:
        """The plain P-Reduce (a direct exchange or the ring all-reduce), weighted when ``weight`` is given."""
        size = len(members)
        counted = [m not in fresh for m in members] if fresh and weight is None else None
        target = work_buf
        if weight is not None:  # average [w x, w] and divide: one collective still
            own = 0.0 if self.rank in fresh else float(weight)
            target = torch.cat([work_buf.reshape(-1) * own, work_buf.new_tensor([own])])
        nbytes = target.numel() * target.element_size()
        if self._direct(target, size):
            self._watching(members, lambda: self._exchange(comm, target, index, size, timeout, counted))
            self.link.collective(members, (size - 1) * nbytes, (size - 1) * nbytes, 1)
            self._count((size - 1) * nbytes, (size - 1) * nbytes)
        else:
            if counted is not None and self.rank in fresh:
                target.zero_()
            self._watching(members, lambda: self._wait(comm.allreduce([target]), timeout, members))
            target.div_(sum(counted) if counted is not None else size)
            ring = ring_allreduce_bytes(size, nbytes)
            self.link.collective(members, ring, ring, 2 * (size - 1))
            self._count(ring, ring)
        if target is not work_buf:
            work_buf.copy_((target[:-1] / target[-1]).view_as(work_buf))

    def _wait(self, work, timeout, members: tuple) -> None:
        """Wait for a collective: gloo's with its timeout, NCCL's by polling (this thread's current stream
        waits for it, never another's: :func:`~hetrain.transport.device_thread.wait_work`)."""
        wait_work(work, timeout, self.backend == "nccl", f"the P-Reduce of group {list(members)}")

    def _plain_bytes(self, buf: torch.Tensor, size: int) -> float:
        """Bytes a member sends in a plain P-Reduce of ``buf`` over ``size`` members."""
        nbytes = buf.numel() * buf.element_size()
        return (size - 1) * nbytes if self._direct(buf, size) else ring_allreduce_bytes(size, nbytes)

    def _count(self, plain: float, sent: float) -> None:
        """Record ``sent`` bytes, and what a plain P-Reduce would have sent (for the compression ratio)."""
        self.uncompressed_bytes += int(plain)
        self.compressed_bytes += int(sent)

    def _dead_members(self, members: tuple, grace_s: float = 0.0) -> list[int]:
        """Members known dead, waiting up to ``grace_s`` for the launcher's notice (a lost peer is
        seen before its death is announced)."""
        if self.is_dead is None:
            return []
        deadline = time.monotonic() + grace_s
        while True:
            dead = [m for m in members if self.is_dead(m)]
            if dead or time.monotonic() >= deadline:
                return dead
            time.sleep(_DEATH_POLL_S)

    def _create_watching(self, members: tuple, key: tuple, buf: torch.Tensor):
        """Create the communicator; in continue mode give up as soon as a member is known dead
        (creation blocks until every member joins, which a dead one never does)."""
        return self._watching(members, lambda: self._create(members, key, buf))

    def _watching(self, members: tuple, call):
        """``call()``; in continue mode given up on (MemberDied) as soon as a member is known dead
        (:func:`hetrain.transport.watched_call.call_unless_dead`)."""
        if self.is_dead is None:
            return call()
        try:
            return call_unless_dead(call, lambda: set(self._dead_members(members)), "P-Reduce", "hetrain-preduce")
        except DeathDuringCall as exc:
            raise MemberDied(self.rank, members, sorted(exc.dead)) from None

    def _direct(self, buf: torch.Tensor, size: int) -> bool:
        return self.backend != "nccl" and uses_direct_exchange(buf.numel() * buf.element_size(), size, self.direct_max_bytes)

    def skip(self, members, comm_id: int | None = None) -> None:
        """Record a group this worker will not run (formed with a process since replaced), so its
        communicator cache moves exactly as the Group Generator's model of it does."""
        members = tuple(sorted(set(int(m) for m in members)))
        if len(members) > 1:
            self._lookup(members, comm_id, None)

    @staticmethod
    def _exchange(comm, buf: torch.Tensor, index: int, size: int, timeout, counted=None) -> None:
        """Send ``buf`` to every other member, receive theirs, average in member order (same bits everywhere);
        ``counted[i]`` False leaves member i's buffer out of the average."""
        gathered = buf.new_empty((size, buf.numel()))
        mine = gathered[index]
        mine.copy_(buf.reshape(-1))  # a contiguous copy: gloo sends only contiguous tensors
        peers = [p for p in range(size) if p != index]
        works = [comm.send([mine], p, _EXCHANGE_TAG) for p in peers]
        works += [comm.recv([gathered[p]], p, _EXCHANGE_TAG) for p in peers]
        for work in works:
            work.wait(timeout)
        rows = [row for i, row in enumerate(gathered) if counted is None or counted[i]]
        total = rows[0]
        for row in rows[1:]:
            total.add_(row)
        buf.copy_(total.reshape(buf.shape)).div_(len(rows))


    def _lookup(self, members: tuple, comm_id: int | None, buf: torch.Tensor) -> tuple:
        if comm_id is None:  # standalone: the set's current communicator, or a new generation (ids < 0)
            known = self.cache.lookup(members)
            if known is None or known >= 0:
                generation = self._generation.get(members, 0) + 1
                self._generation[members] = generation
                known = -generation
            comm_id = known
        hit, evicted = self.cache.use(members, comm_id)
        self.hits += hit
        self.misses += not hit
        for old_members, old_id in evicted:
            self.evictions += 1
            self._drop((old_members, old_id))
        key = (members, comm_id)
        self._uses.setdefault(key, 0)
        return key

    def _drop(self, key: tuple) -> None:
        self._uses.pop(key, None)
        self._replicas.pop(key, None)
        comm = self._comms.pop(key, None)
        if comm is not None and key in self._nccl:
            self._nccl.discard(key)
            comm.shutdown()  # NCCL communicators hold GPU memory until shut down

    def _create(self, members: tuple, key: tuple, buf: torch.Tensor):
        nccl = self.backend == "nccl"
        if nccl:
            self._nccl.add(key)  # (an attribute set on the pybind object raised on torch 2.13)
        return store_group(dist.PrefixStore(self._prefix(key), self.store), members.index(self.rank), len(members),
                           self.timeout_s, nccl=nccl)

    def _prefix(self, key: tuple) -> str:
        members, comm_id = key
        return f"{self.namespace}/{'-'.join(map(str, members))}/{comm_id}/"

    def _diagnose(self, members: tuple, key: tuple, uses: int) -> list[int]:
        """Mark this member's arrival, give the others a moment to do the same, name the absent."""
        base = f"{self._prefix(key)}arrived/{uses}/"
        try:
            self.store.set(f"{base}{self.rank}", "1")
            deadline = time.monotonic() + min(_DIAGNOSE_GRACE_S, self.timeout_s)
            missing = [m for m in members if m != self.rank]
            while missing and time.monotonic() < deadline:
                missing = [m for m in missing if not self.store.check([f"{base}{m}"])]
                time.sleep(0.05)
            return missing
        except Exception:  # the store itself is gone: say nothing rather than mislead
            return []

    @property
    def replica_bytes(self) -> int:
        """Bytes of the public copies this member holds now (compression: group size x the model per set)."""
        return sum(replicas.nbytes for replicas in self._replicas.values())

    def stats(self) -> dict:
        stats = {"cache_hits": self.hits, "cache_misses": self.misses, "cache_evictions": self.evictions}
        if self.codec is not None:
            stats["compressed_preduces"] = self.compressed_calls
            stats["replica_bytes_peak"] = self.replica_bytes_peak
        return stats
