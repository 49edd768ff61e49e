"""A process's children and descendants, their names and whether they live, read from /proc (Linux)."""

from __future__ import annotations

import os


def children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                kids.append(int(entry))
    return kids


def descendants(pid: int) -> list[int]:
    kids = children(pid)
    return kids + [d for kid in kids for d in descendants(kid)]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return False


def comm(pid: int) -> str:
    """The process's name as ps shows it (a worker names itself ``hetrain-wR``)."""
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def workers_of(pid: int) -> list[int]:
    """A launcher's workers: forked by its warm server, each named ``hetrain-wR`` (ps, top)."""
    return [p for p in descendants(pid) if comm(p).startswith("hetrain-w")]
