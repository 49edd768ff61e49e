"""TensorBoard event files through torch's ``SummaryWriter`` (needs the tensorboard package: hetrain[tensorboard])."""

from __future__ import annotations

from pathlib import Path

from hetrain.extras import require


class TensorBoardWriter:
    """Scalars into an event file in ``log_dir`` (``tensorboard --logdir`` on it or on a directory above)."""

    def __init__(self, log_dir: str | Path, flush_secs: int = 5):
        require("tensorboard", "tensorboard", "logging to TensorBoard")
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self._writer = SummaryWriter(log_dir=str(log_dir), flush_secs=flush_secs)

    def add_scalar(self, tag: str, value: float, step: int, walltime: float | None = None) -> None:
        self._writer.add_scalar(tag, float(value), int(step), walltime=walltime)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
