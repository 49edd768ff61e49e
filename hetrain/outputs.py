"""Writing results atomically, so a failed run leaves nothing half-written."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from hetrain.errors import UsageError


def check_out_dir(path: str | os.PathLike) -> Path:
    """``path`` is a directory or nothing yet (it creates nothing); raise UsageError if not."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a directory; pass a directory path")
    return out


def prepare_out_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` if needed and check it is writable; raise UsageError if not."""
    out = check_out_dir(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=out, prefix=".probe-", delete=True)
        probe.close()
    except OSError as exc:
        raise UsageError(f"--out {out}: not writable ({exc.strerror}); choose a directory you can write") from None
    return out


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str | os.PathLike, data) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")
