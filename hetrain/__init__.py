"""hetrain: heterogeneity-aware, communication-efficient distributed training on PyTorch.

Use it in your own training loop (launched by torchrun)::

    import hetrain
    ctx = hetrain.init()                       # joins the torchrun job (gloo on CPU, NCCL on GPU)
    sync = hetrain.Hop(model, ctx, topology="ring")
    while not sync.should_stop(local_done=step >= steps):
        loss = loss_fn(sync.module(x), y); opt.zero_grad(); loss.backward(); opt.step()
        sync.step()
    sync.finish()                              # drain queues; every worker gets the consensus model
    print(sync.metrics())

Protocols: ``Hop``, ``DPSGD``, ``AllReduce`` (DistributedDataParallel), ``Prague``,
``ADPSGD``, ``ParameterServer``; the primitive ``PReduce``. Imported lazily, so
``import hetrain`` stays light.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "init": ("hetrain.runtime.context", "init_from_env"),
    "WorkerContext": ("hetrain.runtime.context", "WorkerContext"),
    "Hop": ("hetrain.runtime.hop", "Hop"),
    "DPSGD": ("hetrain.runtime.hop", "DPSGD"),
    "AllReduce": ("hetrain.runtime.allreduce", "AllReduce"),
    "Prague": ("hetrain.prague.protocol", "Prague"),
    "ADPSGD": ("hetrain.prague.adpsgd", "ADPSGD"),
    "ParameterServer": ("hetrain.prague.parameter_server", "ParameterServer"),
    "PReduce": ("hetrain.prague.preduce", "PReduce"),
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
