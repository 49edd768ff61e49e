"""A local job's temporary folder, and the sweep of the folders killed launchers left behind.

Each job's launcher makes a ``hetrain-job-*`` folder (the workers' ``FileStore``, their results) and
removes it when the job ends. A launcher killed by SIGKILL (its workers die with it:
:mod:`hetrain.jobs.process_guard`) runs no code that could remove it, so the folder stayed. Now the
launcher records itself in the folder (``launcher``: its pid and the start time the kernel gives that
pid), and every new job first removes the folders whose launcher is gone: no process with that pid, or
one that started at another time (the pid reused). A folder with no record (being made, or of an older
hetrain) is left alone.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

PREFIX = "hetrain-job-"
OWNER_FILE = "launcher"


def make_job_dir() -> str:
    """A fresh job folder owned by this process, after sweeping the orphaned ones."""
    sweep_orphaned_job_dirs()
    path = tempfile.mkdtemp(prefix=PREFIX)
    owner = _process_identity(os.getpid())
    if owner is not None:
        Path(path, OWNER_FILE).write_text(owner)
    return path


def sweep_orphaned_job_dirs(parent: str | os.PathLike | None = None) -> list[str]:
    """Remove the job folders under ``parent`` (the temporary folder) whose launcher is gone; return them."""
    removed = []
    for folder in Path(parent or tempfile.gettempdir()).glob(PREFIX + "*"):
        try:
            owner = (folder / OWNER_FILE).read_text()
        except OSError:
            continue  # no record: being made, or not ours to judge
        pid = owner.split(" ", 1)[0]
        if pid.isdigit() and _process_identity(int(pid)) != owner:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(folder))
    return removed


def _process_identity(pid: int) -> str | None:
    """``"pid start-time"`` while that process lives (Linux: the start time tells a reused pid apart;
    elsewhere the pid alone), else None."""
    if os.path.isdir("/proc/self"):
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return None if fields[0] in ("Z", "X") else f"{pid} {fields[19]}"  # field 22: starttime
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's
    return str(pid)
