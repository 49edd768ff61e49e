"""An MLflow run in a local file store by default (hetrain[mlflow]: mlflow-skinny, the client without the server).

The tracking URI is the user's ``MLFLOW_TRACKING_URI`` when set, else ``file:<store_dir>``. MLflow 3
keeps its file store in maintenance mode and refuses it unless ``MLFLOW_ALLOW_FILE_STORE`` is true;
its database store needs SQLAlchemy, which mlflow-skinny leaves out, so for the file store hetrain
sets that variable (in this process, when the user has not set it). Metrics are sent in batches.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from hetrain.extras import require

EXPERIMENT = "hetrain"
BATCH = 1000  # MLflow's limit of metrics per log_batch call


def tracking_uri(store_dir: str | Path) -> str:
    """The user's ``MLFLOW_TRACKING_URI``, or the file store ``store_dir`` (allowed for this process)."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return Path(store_dir).resolve().as_uri()


class MlflowWriter:
    def __init__(self, store_dir: str | Path, run_name: str, config: dict | None = None,
                 experiment: str = EXPERIMENT):
        require("mlflow", "mlflow", "logging to MLflow")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.tracking_uri = tracking_uri(store_dir)
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        params = [Param(k, str(v)[:500]) for k, v in (config or {}).items()]
        for start in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[start:start + 100])
        self._pending: list = []

    def add_scalar(self, tag: str, value: float, step: int, walltime: float | None = None) -> None:
        from mlflow.entities import Metric

        stamp = time.time() if walltime is None else walltime
        self._pending.append(Metric(tag, float(value), int(stamp * 1000), int(step)))
        if len(self._pending) >= BATCH:
            self.flush()

    def flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[:BATCH], self._pending[BATCH:]
            self.client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        self.flush()
        self.client.set_terminated(self.run_id)
