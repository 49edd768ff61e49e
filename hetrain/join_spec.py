"""``--join``: when new workers join a local job that may grow (``--max-workers``); pure, no torch.

``--join`` takes ``none`` (default) or ``K@Ts[,L@Us...]``: K new workers start T seconds into
training (``4@8s``; ``2@10s,2@30s``; the ``s`` is optional). A job started with ``--workers N
--max-workers M`` holds ranks ``0..M-1``; ranks ``N..M-1`` are *vacant* until a worker joins into
them, lowest first, and a rank whose worker left is vacant again. A join that finds no vacant rank
waits for one (a worker that leaves frees its rank). The launcher starts the joining workers as it
starts a dead rank's replacement (docs/decisions/elastic-membership.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hetrain.errors import UsageError

_AT = re.compile(r"^(\d+)@(\d+(?:\.\d*)?)s?$")
FORMS = "none or K@Ts[,L@Us] (K new workers T seconds into training, e.g. 4@8s or 2@10s,2@30s)"


@dataclass(frozen=True)
class JoinSpec:
    """``events``: (training time in seconds, how many workers join then), in time order."""

    events: tuple[tuple[float, int], ...] = ()

    @property
    def total(self) -> int:
        return sum(k for _, k in self.events)

    def check_room(self, start_workers: int, max_workers: int | None) -> JoinSpec:
        """Refuse joins to a job that cannot grow (joins beyond its room wait for ranks that workers leave);
        return self."""
        if self.total and (max_workers or start_workers) == start_workers:
            raise UsageError(f"--join adds {self.total} worker(s) but the job cannot grow: give --max-workers "
                             f"(e.g. --max-workers {start_workers + self.total})")
        return self


def parse_join(spec: str | None) -> JoinSpec:
    """Parse ``--join``; a malformed spec is a one-line :class:`UsageError` naming the forms."""
    text = (spec or "none").strip()
    if text == "none":
        return JoinSpec()
    events = []
    for part in text.split(","):
        match = _AT.match(part.strip())
        if match is None or int(match.group(1)) < 1:
            raise UsageError(f"--join: cannot read {part.strip()!r}; use {FORMS}")
        events.append((float(match.group(2)), int(match.group(1))))
    return JoinSpec(tuple(sorted(events)))
