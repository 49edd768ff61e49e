"""How the ranks of a job without hetrain's launcher (torchrun, the integrations) share the Group
Generator's secret, which must never travel through torch's store (anyone who reaches the store may
read it).

* ``$HETRAIN_JOB_SECRET`` set (the same on every node): that is the secret.
* Otherwise, a Group Generator that listens beyond this machine is refused (:func:`rank0_secret`):
  the ranks of other machines have no way to learn a secret that a stranger could not.
* Otherwise (every rank on this machine): rank 0 draws one and writes it to a file only this user can
  read (mode 0600, in ``<tempdir>/hetrain-<uid>``, mode 0700), and publishes only the file's name
  in the store; the other ranks read the file. A stranger who reads the store learns a name it cannot
  open. Rank 0 removes the file as the Group Generator closes.

See docs/decisions/job-secret.md.
"""

from __future__ import annotations

import os
import stat
import tempfile

from hetrain.errors import UsageError, WorkerError
from hetrain.transport.job_secret import SECRET_ENV, env_secret, new_secret

FILE_KEY = "gg_secret_file"


def private_dir() -> str:
    """``<tempdir>/hetrain-<uid>``, made mode 0700; UsageError if another user owns it or others may enter."""
    path = os.path.join(tempfile.gettempdir(), f"hetrain-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise UsageError(f"{path} must be a folder of this user's that no one else may enter (mode 0700); "
                         f"remove it, or set {SECRET_ENV}")
    return path


def rank0_secret(bind_host: str, is_loopback: bool) -> tuple[str, str | None]:
    """(secret, the path of the file that shares it, or None when ``$HETRAIN_JOB_SECRET`` gives it)."""
    secret = env_secret()
    if secret is not None:
        return secret, None
    if not is_loopback:
        raise UsageError(f"the Group Generator listens on {bind_host}, beyond this machine: set {SECRET_ENV} to the "
                         "same random value for every rank on every node (e.g. export "
                         f"{SECRET_ENV}=$(python -c 'import secrets; print(secrets.token_hex(32))'))")
    secret = new_secret()
    handle, path = tempfile.mkstemp(prefix="gg-", suffix=".secret", dir=private_dir())  # mode 0600
    with os.fdopen(handle, "w") as out:
        out.write(secret)
    return secret, path


def worker_secret(worker: int, file_name: str) -> str:
    """A rank's secret: ``$HETRAIN_JOB_SECRET``, or the file rank 0 named (``file_name``: "" when none)."""
    secret = env_secret()
    if secret is not None:
        return secret
    if not file_name:
        raise WorkerError(f"worker {worker}: rank 0's Group Generator takes {SECRET_ENV}, which this rank lacks; "
                          "set it to the same value for every rank")
    path = os.path.join(private_dir(), os.path.basename(file_name))
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError as exc:
        raise WorkerError(f"worker {worker} could not read the Group Generator's secret from {path} (rank 0 wrote "
                          f"it: is this rank on another machine? then set {SECRET_ENV} on every node): {exc}") from None
