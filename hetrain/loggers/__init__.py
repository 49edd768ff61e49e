"""Logging sinks: where a run's and a worker's figures are written (CSV, TensorBoard, W&B, MLflow).

:mod:`~hetrain.loggers.scalar_writers` (the ``--log`` kinds and their writers),
:mod:`~hetrain.loggers.run_logger` (the launcher's figures over time),
:mod:`~hetrain.loggers.protocol_logger` (a worker's own figures from any loop: ``sync.log_to``).
Each backend is imported only when used; none needs a protocol or a framework adapter.
"""
