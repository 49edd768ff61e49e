"""Who is in the job: the one type every protocol, group service and channel asks.

A protocol built with ``on_failure="continue"`` or ``"respawn"`` is given ``dead_workers``: the local
launcher's :class:`~hetrain.jobs.context.LauncherMembership`, the Lightning strategy's liveness watcher
(:class:`~hetrain.integrations.liveness.StoreLiveness`), or any callable returning the dead ranks (a
user's own). :meth:`Membership.of` wraps each as a :class:`Membership`, so the layers below ask one
type what they need, never probe with ``hasattr``:

* ``dead()`` (also ``membership()``): the ranks known dead now;
* ``incarnations()``: each rank's process number (a replaced rank runs a higher one); all 0 where
  nothing is ever replaced;
* ``incarnation``: this process's own number (> 0: a replacement joining a running job);
* ``confirm_dead(among, known)``: a peer was lost (a send failed, a collective broke): wait at most
  :data:`CONFIRM_DEATH_S` for the membership to name a new death, and return it (empty: it was not a
  death, and the caller raises its own error). One bound for every caller;
* ``record_finish`` / ``finished_without_stop()``: a finishing worker's STOPs, recorded where a
  neighbour a later repair gives it can read that none is coming (the local launcher's shared memory);
* ``freeze(timeout_s)``: a finishing worker ends admissions (a replacement admitted after the final
  average began would be waited for by nobody); True where nothing is ever admitted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

CONFIRM_DEATH_S = 5.0  # a lost peer not named dead within this is not a death (covers a loaded machine's launcher)
POLL_S = 0.05


class Membership:
    """No deaths, no replacements: a job without failure handling (see the module docstring)."""

    incarnation = 0

    def dead(self) -> set[int]:
        return set()

    def __call__(self) -> set[int]:
        return self.dead()

    def incarnations(self) -> list[int] | None:
        """Each rank's process number, or None where ranks are never replaced."""
        return None

    def freeze(self, timeout_s: float) -> bool:
        return True

    def announce_joined(self, timeout_s: float) -> None:
        """A replacement: tell whoever admits it that this process is ready (nothing to tell here)."""

    def note_ready(self) -> None:
        """This worker's protocol is built and stepping (its first step): a launcher that admits
        replacements waits for every original to be ready or dead first. A no-op here."""

    def announce_settled(self) -> None:
        """A replacement: tell whoever admits it that this process now holds the job's model (nothing
        to tell here). Until then it has nothing to bring to the final average."""

    def record_finish(self, update_stops, token_stops) -> None:
        """Before a finishing worker sends its STOPs: whom they go to (kept where others can read it)."""

    def finished_without_stop(self) -> tuple[set[int], set[int]]:
        """(ranks that will send this worker no update STOP, nor a token STOP): finished after a repair
        made them its neighbours. None known here."""
        return set(), set()

    can_leave = False  # whether a launcher can let this worker leave the job (LauncherMembership)

    def ask_to_leave(self) -> None:
        """Ask whoever runs the job to let this worker go (nobody to ask here)."""

    def let_go(self) -> bool:
        """Whether this worker has been let go (the others route around it now)."""
        return False

    def ending(self) -> bool:
        """Whether the job is ending (no one joins or leaves from now on)."""
        return False

    @property
    def replaces(self) -> bool:
        """Whether ranks may come back as new processes (respawn)."""
        return self.incarnations() is not None

    def confirm_dead(self, among: Iterable[int] | None = None, known: Iterable[int] = (),
                     within_s: float = CONFIRM_DEATH_S) -> set[int]:
        """New deaths (among ``among``, if given) named within ``within_s``; empty if none was."""
        watched = None if among is None else set(among)
        deadline = time.monotonic() + within_s
        while True:
            new = self.dead() - set(known)
            if watched is not None:
                new &= watched
            if new or time.monotonic() >= deadline:
                return new
            time.sleep(POLL_S)

    @staticmethod
    def of(dead_workers: Callable[[], set[int]] | Membership | None) -> Membership:
        """``dead_workers`` as a Membership (None: no failure handling)."""
        if dead_workers is None:
            return Membership()
        if isinstance(dead_workers, Membership):
            return dead_workers
        return CallableMembership(dead_workers)


class CallableMembership(Membership):
    """A user's callable that returns the dead ranks (no replacements)."""

    def __init__(self, dead_workers: Callable[[], set[int]]):
        self._dead_workers = dead_workers

    def dead(self) -> set[int]:
        return set(self._dead_workers())


class LostPeers:
    """Peers a worker lost (a send failed, a receive broke) and the membership has not named dead yet.

    A lost peer is a *suspect*: the membership names a real death within :data:`CONFIRM_DEATH_S`, and
    then the worker routes around it; one never named dead is an error the worker raises (lost, yet
    alive: nothing to route around). One rule for every protocol that tolerates deaths."""

    def __init__(self, within_s: float | None = None):
        self.within_s = within_s
        self._since: dict[int, tuple[float, str]] = {}

    def lost(self, peer: int, error: str) -> None:
        """``peer`` was lost with ``error`` (the first report counts)."""
        self._since.setdefault(peer, (time.monotonic(), error))

    def suspects(self) -> set[int]:
        return set(self._since)

    def settle(self, accounted_for: set[int]) -> list[str]:
        """Forget the suspects ``accounted_for`` (dead, or replaced); return the errors of those not named
        dead within the bound (each reported once)."""
        within_s = CONFIRM_DEATH_S if self.within_s is None else self.within_s
        now, errors = time.monotonic(), []
        for peer, (since, error) in list(self._since.items()):
            if peer in accounted_for:
                del self._since[peer]
            elif now - since > within_s:
                errors.append(error)
                del self._since[peer]
        return errors
