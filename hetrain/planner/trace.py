"""Turning an ``nn.Module`` into a planner :class:`~hetrain.planner.layers.Net`.

The module is traced with ``torch.fx`` and its shapes propagated on meta
tensors (no memory, no compute). Linear and Conv2d calls become layers;
an addition of two tensors that come from different layers becomes a join.
Every other operation is treated as layout-preserving and free. Modules come
from ``module:IMPORT_PATH_OR_FILE.py:Class`` (the class must be constructible
without arguments), from ``torchvision:NAME`` (torchvision is optional: built
with ``weights=None`` on the meta device, nothing is downloaded) or are passed
as instances. Zoo names do not come here (:mod:`hetrain.planner.zoo`).
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import math
import operator
from pathlib import Path

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from hetrain.errors import UsageError
from hetrain.planner.layers import INPUT, Layer, Net, Node
from hetrain.protocols.options import OptionError

_ADDS = {operator.add, operator.iadd, torch.add}


def load_module(spec: str, input_shape: tuple[int, ...] | None = None) -> Net:
    """Trace ``module:path:Class``; ``input_shape`` is per sample (no batch dim)."""
    module = _import_class(spec)
    if input_shape is None:
        raise OptionError(f"{{model}} {spec}: pass {{input_shape}} (one sample's shape, e.g. 3,224,224)")
    return trace(module, input_shape, spec.split(":")[-1])


def load_torchvision(spec: str, input_shape: tuple[int, ...] | None = None) -> Net:
    """Trace ``torchvision:NAME`` built with ``weights=None`` on the meta device (default input 3x224x224)."""
    name = spec.split(":", 1)[1].strip()
    try:
        import torchvision.models as tvm
    except Exception as exc:  # noqa: BLE001 - missing, or built for another torch
        why = "is not installed" if isinstance(exc, ImportError) else f"cannot be imported ({type(exc).__name__})"
        raise OptionError(f"{{model}} {spec}: torchvision {why}; install it beside torch, or use a built-in "
                         "name such as resnet50, vgg16 or alexnet (no torchvision needed)") from None
    known = set(tvm.list_models())
    if name not in known:
        raise OptionError(f"{{model}} {spec}: torchvision has no model {name!r} "
                         "(see torchvision.models.list_models())")
    try:
        with torch.device("meta"):
            module = tvm.get_model(name, weights=None)
    except Exception as exc:  # noqa: BLE001
        raise OptionError(f"{{model}} {spec}: torchvision could not build it ({type(exc).__name__}: {exc})") from None
    return trace(module, tuple(input_shape or (3, 224, 224)), f"torchvision:{name}")


def _import_class(spec: str) -> nn.Module:
    parts = spec.split(":")
    if len(parts) != 3 or not parts[1] or not parts[2]:
        raise OptionError(f"{{model}} {spec!r}: write module:PACKAGE.MODULE:Class or module:FILE.py:Class")
    where, cls_name = parts[1], parts[2]
    try:
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise OptionError(f"{{model}} {spec}: file {where} does not exist")
            mod_spec = importlib.util.spec_from_file_location(path.stem, path)
            mod = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(mod)
        else:
            mod = importlib.import_module(where)
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's module failed to import
        raise OptionError(f"{{model}} {spec}: cannot import {where} ({type(exc).__name__}: {exc})") from None
    cls = getattr(mod, cls_name, None)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise OptionError(f"{{model}} {spec}: {where} has no nn.Module class named {cls_name}")
    try:
        return cls()
    except Exception as exc:  # noqa: BLE001
        raise OptionError(f"{{model}} {spec}: {cls_name}() failed ({type(exc).__name__}: {exc}); "
                         "the class must be constructible without arguments") from None


def trace(module: nn.Module, sample_shape: tuple[int, ...], name: str = "model") -> Net:
    """Trace ``module`` on a meta input of shape (2, *sample_shape) into layers and joins.

    A module with real parameters is copied to the meta device first (the original is untouched).
    """
    if any(not p.is_meta for p in module.parameters()):
        try:
            module = copy.deepcopy(module).to("meta")
        except Exception as exc:  # noqa: BLE001
            raise UsageError(f"model {name!r}: cannot copy the module to the meta device ({exc})") from None
    try:
        gm = fx.symbolic_trace(module)
        ShapeProp(gm).propagate(torch.empty((2, *sample_shape), device="meta"))
    except Exception as exc:  # noqa: BLE001 - tracing failures are the model's, reported in one line
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise UsageError(f"model {name!r}: torch.fx could not trace it with input shape {tuple(sample_shape)} "
                         f"({type(exc).__name__}: {first})") from None
    layers: list[Layer] = []
    nodes: list[Node] = []
    prod: dict[fx.Node, frozenset] = {}
    for node in gm.graph.nodes:
        args: list[fx.Node] = []
        fx.node.map_arg((node.args, node.kwargs), args.append)
        sources = [prod.get(a, frozenset()) for a in args]
        union = frozenset().union(*sources) if sources else frozenset()
        if node.op == "placeholder":
            prod[node] = frozenset({INPUT})
        elif node.op == "call_module" and isinstance(gm.get_submodule(node.target), (nn.Linear, nn.Conv2d)):
            if len(union) != 1:
                raise UsageError(f"model {name!r}: layer {node.target} reads the outputs of {len(union)} layers "
                                 "combined by something other than an addition; not supported")
            layers.append(_layer(gm.get_submodule(node.target), node, args[0], name))
            nodes.append(Node("layer", len(layers) - 1, (next(iter(union)),)))
            prod[node] = frozenset({len(nodes) - 1})
        elif _is_add(node) and len(sources) == 2 and sources[0] and sources[1] and sources[0] != sources[1]:
            if len(sources[0]) != 1 or len(sources[1]) != 1:
                raise UsageError(f"model {name!r}: addition {node.name} sums more than two paths; not supported")
            n_adds = sum(1 for n in nodes if n.kind == "add")
            nodes.append(Node("add", n_adds, (next(iter(sources[0])), next(iter(sources[1])))))
            prod[node] = frozenset({len(nodes) - 1})
        elif "tensor_meta" not in node.meta:
            prod[node] = frozenset()  # sizes and other non-tensors carry no layout
        else:
            prod[node] = union
    params = sum(p.numel() for p in module.parameters())
    return Net(name, layers, nodes, total_params=params)


def _is_add(node: fx.Node) -> bool:
    if node.op == "call_function":
        return node.target in _ADDS
    return node.op == "call_method" and node.target in ("add", "add_")


def _layer(mod: nn.Module, node: fx.Node, arg: fx.Node, model: str) -> Layer:
    shape_in = tuple(arg.meta["tensor_meta"].shape)
    shape_out = tuple(node.meta["tensor_meta"].shape)
    bias = mod.bias is not None
    if isinstance(mod, nn.Linear):
        hw = math.prod(shape_in[1:-1])
        return Layer(node.target, "linear", mod.in_features, mod.out_features, 1, hw, hw, bias)
    if mod.groups != 1:
        raise UsageError(f"model {model!r}: {node.target} is a grouped convolution (groups={mod.groups}); "
                         "the planner splits dense layers only")
    return Layer(node.target, "conv", mod.in_channels, mod.out_channels, math.prod(mod.kernel_size),
                 math.prod(shape_in[2:]), math.prod(shape_out[2:]), bias)
