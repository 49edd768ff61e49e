"""Whether a torchrun attempt restarts a job that already trained in its checkpoint directory.

A rank that dies after the job's last checkpoint (every worker's file at ``--iterations``) leaves
checkpoints with nothing left to train, and torchrun ``--max-restarts`` starts the job again with the
same command line. That restart must finish the job (``finish()``, evaluation, the record), not refuse
it as a user's resume of a finished run. Rank 0 writes ``DIR/torchrun.json`` with torchrun's run id
(``TORCHELASTIC_RUN_ID``) as an attempt starts; a later attempt that reads its own run id there restarts
that job. ``--standalone`` draws a new id per torchrun command, so a new command resuming a finished
directory is still refused; a fixed ``--rdzv-id`` reused by a new command reads as the same job.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

MARKER = "torchrun.json"
RUN_ID_ENV = "TORCHELASTIC_RUN_ID"


def restarts_this_job(directory: str) -> bool:
    """An earlier attempt of this torchrun job trained from ``directory``."""
    run_id = os.environ.get(RUN_ID_ENV)
    if run_id is None:
        return False
    try:
        return json.loads((Path(directory) / MARKER).read_text()).get("run_id") == run_id
    except (OSError, ValueError, AttributeError):
        return False


def note_attempt(directory: str) -> None:
    """Record that this torchrun job trains from ``directory`` (rank 0, once its checks passed)."""
    run_id = os.environ.get(RUN_ID_ENV)
    if run_id is None:
        return
    path = Path(directory) / MARKER
    tmp = path.with_name(f".{MARKER}.{os.getpid()}")
    tmp.write_text(json.dumps({"run_id": run_id}) + "\n")
    os.replace(tmp, path)
