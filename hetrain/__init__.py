"""hetrain: heterogeneity-aware, communication-efficient distributed training on PyTorch.

Use it in your own training loop (launched by torchrun), like torch's own averagers::

    import hetrain
    device = hetrain.init()                    # joins the torchrun job (gloo on CPU, NCCL on GPU: see README)
    with hetrain.Hop(model, optimizer, topology="ring") as sync:   # process_group=None: the world
        for x, y in loader:
            optimizer.zero_grad(); loss_fn(model(x), y).backward()
            optimizer.step()                   # then Hop sends, waits as its logic says, averages
    print(sync.metrics())                      # leaving the block drained the queues: consensus model

Protocols: ``Hop``, ``DPSGD``, ``AllReduce`` (DistributedDataParallel), ``Prague``,
``ADPSGD``, ``ParameterServer``; the primitive ``PReduce``. Imported lazily, so
``import hetrain`` stays light (no torch until a protocol is used).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "init": ("hetrain.transport.job", "init"),
    "advise": ("hetrain.advisor.advice", "advise"),
    "Hop": ("hetrain.runtime.hop", "Hop"),
    "DPSGD": ("hetrain.runtime.hop", "DPSGD"),
    "AllReduce": ("hetrain.runtime.allreduce", "AllReduce"),
    "Prague": ("hetrain.runtime.prague", "Prague"),
    "ADPSGD": ("hetrain.runtime.adpsgd", "ADPSGD"),
    "ParameterServer": ("hetrain.runtime.parameter_server", "ParameterServer"),
    "PReduce": ("hetrain.groups.preduce", "PReduce"),
    "PROTOCOLS": ("hetrain.registry", "PROTOCOLS"),
    "make_topology": ("hetrain.topology", "make_topology"),
    "parse_slowdown": ("hetrain.slowdown", "parse_slowdown"),
    "RunConfig": ("hetrain.config", "RunConfig"),
    "UsageError": ("hetrain.errors", "UsageError"),
    "WorkerError": ("hetrain.errors", "WorkerError"),
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'hetrain' has no attribute {name!r}")
