"""Whether this process is a rank of a torchrun job (read from the environment; imports nothing heavy)."""

from __future__ import annotations

import os


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)
