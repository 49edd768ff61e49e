"""Naming a model: the zoo (pure Python), ``torchvision:NAME``, ``module:PATH:Class``, or an nn.Module.

Only the last three import torch (they are traced, :mod:`hetrain.planner.trace`);
a zoo name, a torchvision-style alias of one (``resnet50``, ``vgg16``) or
``gpt:BLOCKSxWIDTH`` is a table of layer shapes and costs no import at all.
"""

from __future__ import annotations

from hetrain.errors import UsageError
from hetrain.planner import zoo
from hetrain.planner.layers import Net


def load(spec, input_shape=None) -> Net:
    """A Net from a name (see the module doc), an ``nn.Module`` instance (pass ``input_shape``) or a Net."""
    if isinstance(spec, Net):
        return spec
    shape = tuple(input_shape) if input_shape is not None else None
    if not isinstance(spec, str):
        from hetrain.planner import trace

        if shape is None:
            raise UsageError("pass input_shape (one sample's shape) to plan an nn.Module instance")
        return trace.trace(spec, shape, type(spec).__name__)
    if spec.startswith("module:"):
        from hetrain.planner import trace

        return trace.load_module(spec, shape)
    if spec.startswith("torchvision:"):
        from hetrain.planner import trace

        return trace.load_torchvision(spec, shape)
    return zoo.build(spec, shape)
