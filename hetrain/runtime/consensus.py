"""Final model consensus, shared by every protocol's ``finish``: over the group, or over its survivors.

:func:`over_survivors` is the loop itself (the parameter server's final broadcast uses it too);
:func:`average_state` runs the final average through it.

After a death (``on_failure="continue"``) the group's own collectives would
wait for the dead, so the survivors build a group of their own on the job's
store, named after the set of the dead (a new *membership generation*: the
same on every survivor that knows the same deaths), as torchft re-creates a
ProcessGroupGloo over a fresh PrefixStore at each reconfiguration. If a
survivor dies during it, the others rebuild with the larger dead set and try
again, until the timeout.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist

from hetrain.errors import WorkerError
from hetrain.runtime.flat_state import FlatState
from hetrain.transport.device_thread import wait_work
from hetrain.transport.job import JobView, subset_group
from hetrain.transport.membership import Membership
from hetrain.transport.watched_call import call_unless_dead

T = TypeVar("T")
_RETRY_PAUSE_S = 0.5


def average_state(state: FlatState, job: JobView, dead_workers: Callable[[], set[int]] | None = None,
                  beacon=None) -> float:
    """Replace every surviving worker's model by the survivors' average; return the consensus distance.

    Consensus distance = sqrt(mean_i ||x_i - mean_x||^2) over the model (not an outer optimizer's
    anchors), measured before averaging (0 when all workers already agree). A collective: every survivor must call it.
    """
    if job.world_size == 1:
        return 0.0
    if beacon is not None:  # a straggler still stepping is waited for here, not inside the collective
        freeze_membership(job, dead_workers, "the final average")  # first: who is waited for is settled
        beacon.wait_for_arrivals(dead_workers, "the final average")
    return over_survivors(job, dead_workers, "the final average",
                          lambda group, survivors, private: _average(state, group, len(survivors), job.timeout,
                                                                     private=private, nccl=job.nccl))


def over_survivors(job: JobView, dead_workers: Callable[[], set[int]] | None, what: str,
                   collective: Callable[[object, list[int], bool], T], name: str = "survivors") -> T:
    """Run ``collective(group, survivors, private)`` over the whole group while nobody is dead, else
    over a group of the survivors (``private``: built on the store, see :func:`survivor_group`).

    Every survivor must call it. A death before or during it (the launcher names the dead) makes the
    survivors give up on that group and rebuild one without the dead, until the job's timeout; ``what``
    names the collective in errors.
    """
    membership = freeze_membership(job, dead_workers, what)
    dead = set(dead_workers()) if dead_workers else set()
    incarnations = membership.incarnations if membership.replaces else None
    replaced = incarnations is not None and any(incarnations())  # the world group holds dead processes' pairs
    everyone = list(range(job.world_size))
    if not dead and not replaced:
        try:
            if dead_workers is None:
                return collective(job.group, everyone, job.private)
            # watched: a worker stopped, then killed as hung, is waited for the whole timeout otherwise
            return call_unless_dead(lambda: collective(job.group, everyone, job.private),
                                    lambda: set(dead_workers()), what, "hetrain-average")
        except Exception as exc:
            if dead_workers is None or not membership.confirm_dead():
                raise WorkerError(f"worker {job.rank} waited for {what} over all {job.world_size} "
                                  f"workers: {_first_line(exc)}") from None
    deadline = time.monotonic() + job.timeout_s
    while True:
        dead = frozenset(dead_workers())
        survivors = [w for w in everyone if w not in dead]
        try:
            group = survivor_group(job, set(dead), name, incarnations=incarnations() if incarnations else None)
            return call_unless_dead(lambda group=group, survivors=survivors: collective(group, survivors, True),
                                    lambda known=dead: set(dead_workers()) - known, what, "hetrain-average")
        except Exception as exc:
            if time.monotonic() > deadline:
                raise WorkerError(f"worker {job.rank} waited for {what} over the survivors "
                                  f"{survivors}: {_first_line(exc)}") from None
            time.sleep(_RETRY_PAUSE_S)  # someone else died meanwhile: the launcher says so shortly


def freeze_membership(job: JobView, dead_workers, what: str) -> Membership:
    """Tell the launcher this worker is finishing and wait until it admits no more replacements (and has
    stopped those admitted that hold no model yet); return the membership. Before any wait for the
    others: a replacement admitted as its neighbours finished may never get a model, and would be
    waited for until the timeout (docs/decisions/replacement-admitted-as-the-job-ends.md)."""
    membership = Membership.of(dead_workers)
    if not membership.freeze(job.timeout_s):
        raise WorkerError(f"worker {job.rank} waited {job.timeout_s:.0f} s for the launcher to close the "
                          f"membership before {what}")
    return membership


def survivor_group(job: JobView, dead: set[int], name: str = "survivors", incarnations: list[int] | None = None):
    """A gloo group of the workers not in ``dead``, built on the store under a name of that set
    (and of each rank's incarnation, when replacements joined: ``respawn``)."""
    survivors = [w for w in range(job.world_size) if w not in dead]
    prefix = f"{name}/{'-'.join(map(str, sorted(dead))) or 'none'}/"
    if incarnations and any(incarnations):
        prefix += "inc-" + "-".join(str(incarnations[w]) for w in survivors) + "/"
    return subset_group(job, survivors, prefix)


def _average(state: FlatState, group, size: int, timeout: datetime.timedelta, *, private: bool,
             nccl: bool = False) -> float:
    """Average ``state`` over ``group`` (a registered torch group, or a ``private`` one built on the store:
    gloo); ``nccl``: the registered group is NCCL's (its work is polled, not waited for inside NCCL)."""
    def all_reduce(tensor: torch.Tensor) -> None:
        work = group.allreduce([tensor]) if private else dist.all_reduce(tensor, group=group, async_op=True)
        wait_work(work, timeout, nccl and not private, "the final average")

    mean = state.gather()
    all_reduce(mean)
    mean /= size
    own = state.gather().sub_(mean)[:state.model_numel]  # x_i - mean, in place: one model-sized buffer
    spread = torch.tensor([float(torch.linalg.vector_norm(own)) ** 2], dtype=torch.float64, device=mean.device)
    del own
    all_reduce(spread)
    state.scatter(mean)
    return float(torch.sqrt(spread / size).item())


def _first_line(exc: Exception) -> str:
    text = str(exc)
    return text.splitlines()[0][:200] if text else type(exc).__name__
