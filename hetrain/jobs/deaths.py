"""What a local job knows of its deaths and replacements (``continue`` and ``respawn``): records only.

A death's record holds the rank and incarnation that died, how (``describe_exit``),
the training time and iteration of its last report, ``wall_s`` (seconds from the job's start to
the death seen), and ``recovery_s``: seconds
until every survivor has computed again (from their progress reports). A
replacement's record runs from its start until it announces it joined.
"""

from __future__ import annotations

import time


class DeathRecords:
    """``started_at``: the job's start (``time.monotonic()``); a death's ``wall_s`` counts from it."""

    def __init__(self, started_at: float | None = None):
        self.records: list[dict] = []  # in order; keys starting with "_" are the launcher's own
        self.started_at = time.monotonic() if started_at is None else started_at

    def known(self, rank: int, incarnation: int) -> bool:
        """Whether the death of ``rank``'s process ``incarnation`` is already recorded."""
        return any(d["rank"] == rank and d["incarnation"] == incarnation for d in self.records)

    def not_admitted(self, rank: int, incarnation: int) -> None:
        """A replacement stopped because the job was ending: not a death anyone must recover from."""
        self.records.append({"rank": rank, "incarnation": incarnation, "_not_admitted": True})

    def died(self, rank: int, incarnation: int, how: str, cause: str, started_t_s: float, last_report: dict,
             training_time_s: float, survivors_computed: dict[int, int]) -> None:
        """``cause``: injected (``--fail``), hung (no heartbeat), signal or exit."""
        self.records.append({"rank": rank, "incarnation": incarnation, "how": how, "cause": cause,
                             "started_t_s": started_t_s,
                             "iteration": last_report.get("iteration", 0), "t_s": training_time_s,
                             "wall_s": time.monotonic() - self.started_at, "computed": last_report.get("computed", 0),
                             "recovery_s": None, "_died_at": time.monotonic(), "_awaiting": dict(survivors_computed)})

    def last_iteration(self, rank: int) -> int:
        return max((d.get("iteration", 0) for d in self.records if d["rank"] == rank), default=0)

    def note_recoveries(self, progress: dict[int, dict], is_dead) -> None:
        """A death's recovery ends when every survivor has computed again (or died, or finished)."""
        for event in self.records:
            awaiting = event.get("_awaiting")
            if not awaiting:
                continue
            for rank in list(awaiting):
                report = progress.get(rank, {})
                if is_dead(rank) or report.get("done") or report.get("computed", 0) > awaiting[rank]:
                    del awaiting[rank]
            if not awaiting:
                event["recovery_s"] = time.monotonic() - event["_died_at"]
                event.pop("_awaiting")

    def last_cause(self) -> dict:
        return [d for d in self.records if "how" in d][-1]

    def public(self) -> list[dict]:
        """The deaths as the run's record lists them (stopped replacements left out)."""
        return [{k: v for k, v in d.items() if not k.startswith("_")} for d in self.records
                if not d.get("_not_admitted")]


class Replacements:
    """Replacements started and not yet joined, and those that joined (``respawn``)."""

    def __init__(self):
        self.joining: dict[int, dict] = {}  # rank -> its replacement's record until it joins
        self.joined: list[dict] = []
        self.unsettled: dict[int, int] = {}  # rank -> incarnation: admitted, not yet holding the job's model
        self.deferred: list[tuple[int, int]] = []  # (rank, incarnation) ready, admitted once none is unsettled
        self.stopped_pids: set[int] = set()  # replacements killed because the job was ending

    def started(self, rank: int, incarnation: int, t_s: float, new_member: bool = False) -> None:
        """``new_member``: a worker joining a vacant rank (the job grows), not a dead one's replacement."""
        self.joining[rank] = {"rank": rank, "incarnation": incarnation, "started_t_s": t_s,
                              "new_member": new_member, "_started": time.monotonic()}

    def forget(self, rank: int) -> None:
        self.joining.pop(rank, None)
        self.unsettled.pop(rank, None)
        self.deferred = [(r, i) for r, i in self.deferred if r != rank]

    def join(self, rank: int, incarnation: int, training_time_s: float, wall_s: float | None = None) -> bool:
        """Record that ``rank``'s replacement ``incarnation`` joined (``wall_s``: seconds from the job's start);
        False if it is not the one we wait for."""
        record = self.joining.get(rank)
        if record is None or record["incarnation"] != incarnation:
            return False
        del self.joining[rank]
        record.update(joined_t_s=training_time_s, join_s=time.monotonic() - record.pop("_started"), wall_s=wall_s)
        self.joined.append(record)
        self.unsettled[rank] = incarnation
        return True

    def admitting(self) -> bool:
        """Whether an admitted replacement holds no model yet (the next one ready waits its turn)."""
        return bool(self.unsettled)

    def settled(self, rank: int, incarnation: int) -> None:
        """``rank``'s replacement ``incarnation`` took the job's model from its neighbours."""
        if self.unsettled.get(rank) == incarnation:
            del self.unsettled[rank]

    def stopped_unsettled(self, rank: int, incarnation: int) -> None:
        """The job ended before ``rank``'s admitted replacement held a model: it was stopped (its join
        record says so; it trained nothing)."""
        self.unsettled.pop(rank, None)
        for record in self.joined:
            if record["rank"] == rank and record["incarnation"] == incarnation:
                record["stopped_before_settling"] = True
