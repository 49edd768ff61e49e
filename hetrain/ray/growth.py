"""How a Ray job grows: how far (``max_workers``, ``joins``), checked before the cluster is joined, and
when its vacant ranks join; no Ray here (docs/decisions/ray-jobs-grow-and-drain.md)."""

from __future__ import annotations


def check_growth(num_workers: int, max_workers: int | None, joins: list[tuple[float, int]] | None) -> int:
    """The job's largest size (``max_workers``, or ``num_workers`` for a fixed job); ValueError for a
    ``max_workers`` below ``num_workers`` or ``joins`` to a job that cannot grow, before anything starts
    (joins beyond the room wait for ranks that workers leave)."""
    if max_workers is not None and max_workers < num_workers:
        raise ValueError(f"max_workers ({max_workers}) must be at least the starting workers ({num_workers})")
    world = max_workers or num_workers
    if joins and world == num_workers:
        raise ValueError(f"joins add {sum(k for _, k in joins)} workers to a job of {num_workers} that cannot "
                         "grow: give max_workers")
    return world


def joins_when_room(joins: list[tuple[float, int]] | None) -> bool:
    """Whether the vacant ranks join as the cluster makes room for them: unless a ``joins`` schedule
    (``--join K@Ts``) says when, as in a local job (each then waits for room if there is none)."""
    return not joins


def joins_now(placed: list[int], replacements) -> list[int]:
    """Of the vacant ranks the cluster has room for (``placed``, lowest first), those to start now: the
    lowest, once no worker is joining (:class:`hetrain.jobs.deaths.Replacements`: none started and not yet
    admitted, none admitted and not yet holding the job's model). Two new neighbours started together hung
    in their first connections (docs/decisions/ray-jobs-grow-and-drain.md)."""
    if replacements.joining or replacements.unsettled or replacements.deferred:
        return []
    return placed[:1]
