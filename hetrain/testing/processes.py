"""A local job's workers seen from outside, as an operator sees them: by process name, in /proc."""

from __future__ import annotations

import os


def worker_pids() -> dict[int, int]:
    """rank -> pid of the first-incarnation workers running now (named ``hetrain-wR``; replacements
    are ``hetrain-wR.I``). Linux only: an empty dict elsewhere."""
    pids: dict[int, int] = {}
    if not os.path.isdir("/proc"):
        return pids
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as handle:
                name = handle.read().strip()
        except OSError:
            continue
        if name.startswith("hetrain-w") and "." not in name and name[len("hetrain-w"):].isdigit():
            pids[int(name[len("hetrain-w"):])] = int(entry)
    return pids
