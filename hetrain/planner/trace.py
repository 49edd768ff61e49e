"""Turning an ``nn.Module`` into a planner :class:`~hetrain.planner.layers.Net`.

The module is traced with ``torch.fx`` and its shapes propagated on meta
tensors (no memory, no compute). Linear and Conv2d calls become layers
(a convolution keeps its stride, padding and dilation for the executor);
an addition of two tensors that come from different layers becomes a join.
Every other operation is treated as layout-preserving and free; but a module
with weights of its own other than a normalisation layer (Conv1d, Embedding,
MultiheadAttention, ...) and a parameter multiplied directly (``x @ self.w``,
``F.linear``) are refused, not left out of the plan. Modules come
from ``module:IMPORT_PATH_OR_FILE.py:Class`` (the class must be constructible
without arguments), from ``torchvision:NAME`` (torchvision is optional: built
with ``weights=None`` on the meta device, nothing is downloaded) or are passed
as instances. Zoo names do not come here (:mod:`hetrain.planner.zoo`).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import io
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
# leaf modules with parameters that act per channel or per feature (scale and shift): free in the model, as
# activations are; any other leaf module that owns parameters is refused rather than left out of the plan
_FREE_WITH_PARAMS = tuple(getattr(nn, n) for n in (
    "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "LazyBatchNorm1d", "LazyBatchNorm2d",
    "LazyBatchNorm3d", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "LayerNorm", "GroupNorm",
    "RMSNorm", "LocalResponseNorm", "PReLU") if hasattr(nn, n))
# functions and methods that multiply by a weight: a parameter read directly into one is a weighted layer
# the planner would otherwise leave out
_WEIGHTED_FUNCTIONS = {torch.matmul, torch.mm, torch.bmm, torch.einsum, torch.conv1d, torch.conv2d, torch.conv3d,
                       torch.nn.functional.linear, torch.nn.functional.bilinear, torch.nn.functional.embedding,
                       torch.nn.functional.conv1d, torch.nn.functional.conv2d, torch.nn.functional.conv3d,
                       torch.nn.functional.conv_transpose1d, torch.nn.functional.conv_transpose2d,
                       torch.nn.functional.conv_transpose3d, operator.matmul}
_WEIGHTED_METHODS = {"matmul", "mm", "bmm", "__matmul__"}


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
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
    try:
        gm = fx.symbolic_trace(module)
        with contextlib.redirect_stderr(io.StringIO()):  # ShapeProp prints the whole traceback before raising
            ShapeProp(gm).propagate(torch.empty((2, *sample_shape), device="meta", dtype=dtype))
    except Exception as exc:  # noqa: BLE001 - tracing failures are the model's, reported in one line
        cause = exc.__cause__ if exc.__cause__ is not None else exc  # ShapeProp wraps the model's own error
        first = (str(cause).strip().splitlines() or [""])[0][:200]
        raise UsageError(f"model {name!r}: torch.fx could not trace it with input shape {tuple(sample_shape)} "
                         f"({type(cause).__name__}: {first})") from None
    layers: list[Layer] = []
    nodes: list[Node] = []
    prod: dict[fx.Node, frozenset] = {}
    weights: dict[fx.Node, str] = {}  # nodes that hold a parameter (read directly, not through a module)
    for node in gm.graph.nodes:
        held = _param_source(gm, node, weights)
        if held is not None:
            weights[node] = held
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
        elif node.op == "call_module" and _owns_weights(gm.get_submodule(node.target)):
            mod = gm.get_submodule(node.target)
            raise UsageError(f"model {name!r}: layer {node.target} ({type(mod).__name__}) has weights the planner "
                             "cannot split (it plans Linear and Conv2d layers; normalisation layers count as free)")
        elif _multiplies_weight(node, weights):
            raise UsageError(f"model {name!r}: {node.name} ({_target_name(node)}) multiplies by the parameter "
                             f"{_multiplies_weight(node, weights)} directly; the planner plans nn.Linear and "
                             "nn.Conv2d modules only")
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


def _owns_weights(mod: nn.Module) -> bool:
    """A called leaf module with parameters of its own that is not a per-channel (free) layer."""
    return not isinstance(mod, _FREE_WITH_PARAMS) and any(True for _ in mod.parameters())


def _param_source(gm: fx.GraphModule, node: fx.Node, weights: dict) -> str | None:
    """The parameter ``node`` holds (read with get_attr, perhaps transposed or reshaped), else None."""
    if node.op == "get_attr":
        try:
            gm.get_parameter(node.target)
        except AttributeError:
            return None
        return node.target
    args: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), args.append)
    if node.op in ("call_function", "call_method") and args and all(a in weights for a in args):
        return weights[args[0]]
    return None


def _multiplies_weight(node: fx.Node, weights: dict) -> str | None:
    """The parameter a weighted function or method (matmul, F.linear, conv, ...) ``node`` multiplies by."""
    if node.op == "call_function" and node.target not in _WEIGHTED_FUNCTIONS:
        return None
    if node.op == "call_method" and node.target not in _WEIGHTED_METHODS:
        return None
    if node.op not in ("call_function", "call_method"):
        return None
    args: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), args.append)
    found = [weights[a] for a in args if a in weights]
    return found[0] if found and len(found) < len(args) else None


def _target_name(node: fx.Node) -> str:
    return node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))


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
    padding = mod.padding if isinstance(mod.padding, str) else tuple(mod.padding)
    return Layer(node.target, "conv", mod.in_channels, mod.out_channels, math.prod(mod.kernel_size),
                 math.prod(shape_in[2:]), math.prod(shape_out[2:]), bias, stride=tuple(mod.stride), padding=padding,
                 dilation=tuple(mod.dilation), padding_mode=mod.padding_mode)
