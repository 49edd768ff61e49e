"""Protocol name -> class that implements it (imported lazily)."""

from __future__ import annotations

import importlib

from hetrain.config import RunConfig
from hetrain.runtime.context import WorkerContext
from hetrain.runtime.protocol import SyncProtocol

PROTOCOL_CLASSES = {
    "allreduce": "hetrain.runtime.allreduce:AllReduce",
    "dpsgd": "hetrain.runtime.hop:DPSGD",
    "hop": "hetrain.runtime.hop:Hop",
    "prague": "hetrain.prague.protocol:Prague",
    "adpsgd": "hetrain.prague.adpsgd:ADPSGD",
    "ps": "hetrain.prague.parameter_server:ParameterServer",
}


def protocol_class(name: str) -> type[SyncProtocol]:
    module_name, _, class_name = PROTOCOL_CLASSES[name].partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def build_protocol(config: RunConfig, model, ctx: WorkerContext) -> SyncProtocol:
    """Create the protocol named by ``config.protocol`` for this worker.

    Every protocol class offers ``from_config(model, ctx, config)``.
    """
    return protocol_class(config.protocol).from_config(model, ctx, config)
