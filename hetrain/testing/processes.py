"""A local job's workers seen from outside, as an operator sees them: by process name, in /proc."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def worker_pids(under: int | None = None) -> dict[int, int]:
    """rank -> pid of the first-incarnation workers running now (named ``hetrain-wR``; replacements
    are ``hetrain-wR.I``). ``under``: only descendants of that process (the job one started), so
    that jobs running side by side (tests in parallel) are told apart. Linux only: an empty dict
    elsewhere."""
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
            if under is None or _descends_from(int(entry), under):
                pids[int(name[len("hetrain-w"):])] = int(entry)
    return pids


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])  # the name may hold spaces and parentheses
    except (OSError, IndexError, ValueError):
        return 0


def _descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        pid = _parent(pid)
        if pid == ancestor:
            return True
    return False


def torchrun_rank_pids(agent: int) -> dict[int, int]:
    """rank -> pid of the ranks a torchrun agent (pid ``agent``, or a process above it) runs now: the
    descendants whose environment holds torchrun's ``RANK``. Linux only: an empty dict elsewhere."""
    return rank_pids(agent, "RANK", marker="TORCHELASTIC_RUN_ID")


def rank_pids(ancestor: int, variable: str, marker: str | None = None) -> dict[int, int]:
    """value -> pid of the descendants of ``ancestor`` whose environment sets ``variable`` (a rank:
    ``RANK``, ``LOCAL_RANK``) and, if given, ``marker``. Linux only: an empty dict elsewhere."""
    pids: dict[int, int] = {}
    if not os.path.isdir("/proc"):
        return pids
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or not _descends_from(int(entry), ancestor):
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                env = dict(item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item)
        except OSError:
            continue
        if variable.encode() in env and (marker is None or marker.encode() in env):
            pids[int(env[variable.encode()])] = int(entry)
    return pids


def run_in_own_session(command: list[str], *, cwd, env: dict, timeout_s: float) -> tuple[int, str]:
    """Run ``command`` (which may start processes of its own: Lightning's ranks, torchrun's) in a new
    session and return its exit code and output; on return, on a timeout or on any error, every
    process of that session is killed, so that no rank outlives the test."""
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output = proc.communicate(timeout=timeout_s)[0]
    except subprocess.TimeoutExpired:
        output = f"timed out after {timeout_s} s"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return proc.returncode, output
