"""Point-to-point links to each peer over a two-member gloo group of its own.

gloo connects lazily, and its connections within one group are made one after another: a peer
that died before it ever connected (a death during start-up) held every connection of a
world-sized group until the timeout. With a group per pair only the dead peer's link waits. Used
where deaths are tolerated (``continue``, ``respawn``): Hop's and D-PSGD's peer channels and the
parameter server's links to rank 0. Groups are built on first use, named by both ranks and their
process numbers (:func:`hetrain.transport.job.pair_group`), the same on both sides.
"""

from __future__ import annotations

import threading

from hetrain.transport.job import JobView, pair_group


class PairLinks:
    def __init__(self, job: JobView, name: str, *, cpu: bool = False):
        self.job = job
        self.name = name
        self.cpu = cpu
        self._groups: dict[tuple[int, int, int], object] = {}
        self._building: dict[tuple[int, int, int], threading.Lock] = {}  # a lock per pair being built
        self._lock = threading.Lock()  # guards the two dicts only, never held while a group is built

    def link(self, peer: int, incarnations: tuple[int, int] = (0, 0)) -> tuple[object, int]:
        """(group, peer's index in it) for this process (incarnation ``incarnations[0]``) and ``peer``'s.

        Threads may ask at once: each pair is built once, under its own lock. Building waits in the store
        for the peer to build its side, so one lock over every pair made a thread that waited for peer A
        hold up the thread that would answer peer B, while A waited for this process's link to B: two
        ring neighbours joining a Ray job together hung 60 s in 3 of 12 runs
        (docs/decisions/ray-jobs-grow-and-drain.md)."""
        key = (peer, *incarnations)
        index = 0 if peer < self.job.rank else 1
        with self._lock:
            group = self._groups.get(key)
            if group is not None:
                return group, index
            building = self._building.setdefault(key, threading.Lock())
        with building:
            with self._lock:
                group = self._groups.get(key)
            if group is None:
                group = pair_group(self.job, self.name, peer, incarnations, cpu=self.cpu)
                with self._lock:
                    self._groups[key] = group
        return group, index

    def send(self, tensors: list, dst: int, tag: int):
        group, index = self.link(dst)
        return group.send(tensors, index, tag)

    def recv(self, tensors: list, src: int, tag: int):
        group, index = self.link(src)
        return group.recv(tensors, index, tag)

    def clear(self) -> None:
        with self._lock:
            self._groups.clear()
            self._building.clear()
