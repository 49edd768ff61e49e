"""Optional dependencies of the integrations: imported on use, with a one-line error naming the extra."""

from __future__ import annotations

import importlib


def require(module: str, extra: str, what: str):
    """Import ``module``, or raise ImportError: "``what`` needs ``extra``: pip install 'hetrain[extra]'"."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{what} needs {extra}: pip install 'hetrain[{extra}]'") from None
