"""How a failed local job is told: one line naming the worker that failed first, and a log of everything.

The line names the cause, not a survivor's complaint about the connection it
lost: a worker that died (``worker 1 was killed by SIGKILL ...``) comes before
those that merely reported an error afterwards, and with no death a worker that
waited out its timeout (it names whom it waited for) before one that lost a
connection; a usage error a worker found (bad input only visible inside the job)
is raised as such.
"""

from __future__ import annotations

import time

from hetrain.errors import UsageError, WorkerError


def failure_error(dead: dict[int, str], failures: dict[int, tuple[str, str, str | None]],
                  log_path) -> Exception:
    """The exception to raise. ``dead``: rank -> how each worker that died without a report ended, in words
    (:func:`hetrain.jobs.process_guard.describe_exit`, or what the launcher knows better: hung, injected);
    ``failures``: rank -> (kind, summary, detail) of those that reported one; ``log_path``: where the
    tracebacks went (None: nowhere)."""
    see_log = f" (tracebacks: {log_path})" if log_path and failures else ""
    usage = [r for r, (kind, _, _) in failures.items() if kind == "usage"]
    if usage:
        return UsageError(failures[usage[0]][1])
    if dead:
        first = next(iter(dead))
        others = [r for r in failures if r != first]
        after = f"; then worker {others[0]} failed: {first_line(failures[others[0]][1])}" if others else ""
        return WorkerError(f"worker {first} {dead[first]}{after}{see_log}")
    rank = _first_cause(failures)
    return WorkerError(f"worker {rank} failed: {first_line(failures[rank][1])}{see_log}")


def _first_cause(failures: dict[int, tuple[str, str, str | None]]) -> int:
    """With no death: a worker whose own wait ran out its timeout names whom it waited for (a hung peer:
    "waited 5 s for ...", "a send to worker 1 did not complete within 5 s"); one that lost a connection
    because another wait timed out names only the survivor that gave up first. The first report otherwise."""
    def rank_of(line: str) -> int:
        if "lost its connection" in line or "another wait" in line:
            return 0  # a consequence
        return 2 if " waited " in line or "did not complete within" in line else 1

    lines = {rank: first_line(summary) for rank, (_, summary, _) in failures.items()}
    return max(lines, key=lambda rank: rank_of(lines[rank]))  # max keeps the first of the best


def write_log(log_path, dead: dict[int, str], failures: dict[int, tuple[str, str, str | None]]) -> bool:
    """Every worker's traceback (and every silent death) to ``log_path``; False if it could not be written."""
    lines = [f"hetrain job failed at {time.strftime('%Y-%m-%d %H:%M:%S')}"]
    for rank, how in dead.items():
        lines.append(f"\n== worker {rank} {how} (no report)")
    for rank, (_, summary, detail) in failures.items():
        lines.append(f"\n== worker {rank} failed: {summary}\n{detail or ''}")
    try:
        with open(log_path, "w") as handle:
            handle.write("\n".join(lines) + "\n")
    except OSError:
        return False
    return True


def first_line(text: str) -> str:
    text = (text or "").strip()
    return text.splitlines()[0] if text else "unknown error"
