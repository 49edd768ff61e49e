"""Built-in models as layer tables, computed in pure Python (no torch import, no tracing).

Shapes follow the papers / torchvision, and each table equals what tracing the
matching ``nn.Module`` of :mod:`hetrain.planner.zoo_torch` gives (same layer
names, sizes, joins and parameter counts; ``tests/planner/test_zoo.py``):
LeNet-5 (32x32 input), AlexNet (the single-tower "one weird trick" variant
torchvision ships, 61.1M), VGG-A..E (Simonyan & Zisserman table 1) with or
without batch norm, ResNet-18/34/50/101/152 and Wide ResNet-50-2/101-2 (He et
al.; torchvision's v1.5 with the stride on the 3x3), a wide MLP, one
transformer block, and GPT-style decoders by block count and width.

Names: ``vgg-a``..``vgg-e`` (= ``vgg-11/13/16/19``), torchvision's spellings
(``resnet50``, ``vgg16``, ``vgg16_bn``, ``wide_resnet50_2``, ...), GPT-2's
sizes (``gpt2``, ``gpt2-medium``, ``gpt2-large``, ``gpt2-xl``) and
``gpt:BLOCKSxWIDTH`` (e.g. ``gpt:24x1024``; sequence 1,024, GPT-2's vocabulary
of 50,257 with the head tied to the token embedding).
"""

from __future__ import annotations

import re

from hetrain.errors import UsageError
from hetrain.planner.layers import INPUT, Layer, Net, Node
from hetrain.protocols.options import OptionError

VGG_CONFIGS = {
    "a": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "b": [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "c": [64, 64, "M", 128, 128, "M", 256, 256, "1-256", "M", 512, 512, "1-512", "M", 512, 512, "1-512", "M"],
    "d": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
    "e": [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"],
}
GPT_VOCAB, GPT_SEQ = 50257, 1024
GPT_SIZES = {"gpt2": (12, 768), "gpt2-medium": (24, 1024), "gpt2-large": (36, 1280), "gpt2-xl": (48, 1600)}


class _Builder:
    """Appends layers and joins in forward order; a tensor is (node id, channels, height, width)."""

    def __init__(self, name: str):
        self.name, self.layers, self.nodes, self.extra_params = name, [], [], 0

    def conv(self, x, label, co, k, stride=1, pad=0, bias=True):
        nid, ci, h, w = x
        ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        if ho < 1 or wo < 1:
            raise UsageError(f"model {self.name!r}: input too small, {label} would produce {ho}x{wo} outputs")
        return self._layer(Layer(label, "conv", ci, co, k * k, h * w, ho * wo, bias, stride=(stride, stride),
                                       padding=(pad, pad), dilation=(1, 1)), nid), co, ho, wo

    def linear(self, x, label, do, bias=True, seq=1):
        nid, di, _, _ = x
        return self._layer(Layer(label, "linear", di, do, 1, seq, seq, bias), nid), do, 1, 1

    def norm(self, x, affine_per_channel=2):
        self.extra_params += affine_per_channel * x[1]
        return x

    def _layer(self, layer, producer):
        self.layers.append(layer)
        self.nodes.append(Node("layer", len(self.layers) - 1, (producer,)))
        return len(self.nodes) - 1

    def add(self, x, y):
        joins = sum(1 for n in self.nodes if n.kind == "add")
        self.nodes.append(Node("add", joins, (x[0], y[0])))
        return len(self.nodes) - 1, x[1], x[2], x[3]

    def net(self, name):
        params = sum(la.params for la in self.layers) + self.extra_params
        return Net(name, self.layers, self.nodes, total_params=params)


def _pool(x, k, stride, pad=0):
    nid, c, h, w = x
    ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    if ho < 1 or wo < 1:
        raise UsageError(f"input too small: a {k}x{k} pooling would produce {ho}x{wo} outputs")
    return nid, c, ho, wo


def _image(sample, name, channels=3):
    if len(sample) != 3 or sample[0] != channels:
        raise UsageError(f"model {name!r} reads {channels}xHxW images; got input shape {tuple(sample)}")
    return INPUT, channels, sample[1], sample[2]


def _classifier(b, x, name, expect_hw, label="classifier", dims=(4096, 4096), classes=1000):
    nid, c, h, w = x
    if (h, w) != expect_hw:
        raise UsageError(f"model {name!r}: its classifier reads {c}x{expect_hw[0]}x{expect_hw[1]} features, "
                         f"the input shape gives {c}x{h}x{w}; use the model's input size (e.g. 3,224,224)")
    x = (nid, c * h * w, 1, 1)
    for i, d in enumerate((*dims, classes)):
        x = b.linear(x, f"{label}.{1 + 2 * i}", d)
    return x


def lenet(sample=(1, 32, 32)):
    b = _Builder("lenet")
    x = _image(sample, "lenet", 1)
    x = _pool(b.conv(x, "features.0", 6, 5), 2, 2)
    x = _pool(b.conv(x, "features.3", 16, 5), 2, 2)
    _classifier(b, x, "lenet", (5, 5), dims=(120, 84), classes=10)
    return b.net("lenet")


def alexnet(sample=(3, 224, 224)):
    b = _Builder("alexnet")
    x = _image(sample, "alexnet")
    specs = [(64, 11, 4, 2), (192, 5, 1, 2), (384, 3, 1, 1), (256, 3, 1, 1), (256, 3, 1, 1)]
    pos = 0
    for i, (co, k, s, p) in enumerate(specs):
        x = b.conv(x, f"features.{pos}", co, k, s, p)
        pos += 2
        if i in (0, 1, 4):
            x, pos = _pool(x, 3, 2), pos + 1
    _classifier(b, x, "alexnet", (6, 6))
    return b.net("alexnet")


def vgg(config: str, sample=(3, 224, 224), bn: bool = False):
    name = f"vgg-{config}" + ("-bn" if bn else "")
    b = _Builder(name)
    x = _image(sample, name)
    pos = 0
    for v in VGG_CONFIGS[config]:
        if v == "M":
            x, pos = _pool(x, 2, 2), pos + 1
            continue
        k, co = (1, int(v[2:])) if isinstance(v, str) else (3, v)
        x = b.conv(x, f"features.{pos}", co, k, 1, k // 2)
        pos += 1
        if bn:
            x, pos = b.norm(x), pos + 1
        pos += 1  # ReLU
    _classifier(b, x, name, (7, 7))
    return b.net(name)


def resnet(name: str, bottleneck: bool, counts, sample=(3, 224, 224), width_factor: int = 1):
    b = _Builder(name)
    x = _image(sample, name)
    x = b.norm(b.conv(x, "stem.0", 64, 7, 2, 3, bias=False))
    x = _pool(x, 3, 2, 1)
    expansion = 4 if bottleneck else 1
    k = 0
    for stage, n in enumerate(counts):
        planes = 64 * 2**stage
        width = planes * width_factor
        for i in range(n):
            stride = 2 if (i == 0 and stage > 0) else 1
            co = planes * expansion
            p = f"blocks.{k}"
            if bottleneck:
                y = b.norm(b.conv(x, f"{p}.body.0", width, 1, bias=False))
                y = b.norm(b.conv(y, f"{p}.body.3", width, 3, stride, 1, bias=False))
                y = b.norm(b.conv(y, f"{p}.body.6", co, 1, bias=False))
            else:
                y = b.norm(b.conv(x, f"{p}.body.0", co, 3, stride, 1, bias=False))
                y = b.norm(b.conv(y, f"{p}.body.3", co, 3, 1, 1, bias=False))
            short = x if (stride == 1 and x[1] == co) else b.norm(b.conv(x, f"{p}.down.0", co, 1, stride, bias=False))
            x = b.add(y, short)
            k += 1
    x = (x[0], x[1], 1, 1)  # adaptive average pooling
    b.linear(x, "head.2", 1000)
    return b.net(name)


def mlp(sample=(784,), sizes=(4096, 4096, 4096, 10)):
    b = _Builder("mlp")
    if len(sample) != 1:
        raise UsageError(f"model 'mlp' reads flat vectors; got input shape {tuple(sample)}")
    x = (INPUT, sample[0], 1, 1)
    for i, d in enumerate(sizes):
        x = b.linear(x, f"net.{2 * i}", d)
    return b.net("mlp")


def _sequence(sample, name, d, default_seq):
    if len(sample) == 0:
        return default_seq
    if len(sample) > 2 or (len(sample) == 2 and sample[1] != d):
        raise UsageError(f"model {name!r} reads sequences of width {d}: give the input shape as SEQ or SEQ,{d}")
    return sample[0]


def _attention(qkv):
    """softmax(q k^T) v: no weights; the planner treats it as layout-preserving, d = 3d / 3 features out."""
    nid, c, h, w = qkv
    return nid, c // 3, h, w


def transformer(sample=(512, 1024), d: int = 1024, hidden: int = 4096):
    """One pre-norm block (attention projections and MLP), d_model 1024, on sequences of 512 tokens."""
    b = _Builder("transformer")
    seq = _sequence(sample, "transformer", d, 512)
    x = b.norm((INPUT, d, 1, 1))
    a = b.linear(_attention(b.linear(x, "qkv", 3 * d, seq=seq)), "proj", d, seq=seq)
    x = b.add(x, a)
    y = b.linear(b.linear(b.norm(x), "fc1", hidden, seq=seq), "fc2", d, seq=seq)
    b.add(x, y)
    return b.net("transformer")


def gpt(blocks: int, d: int, sample=(), name: str | None = None, vocab: int = GPT_VOCAB):
    """GPT-2-style decoder: ``blocks`` pre-norm blocks of width ``d`` (MLP 4d), head tied to the embedding.

    The planner's layers are each block's ``attn.c_attn`` (d -> 3d), ``attn.c_proj``, ``mlp.c_fc``
    (d -> 4d), ``mlp.c_proj`` and the LM head (d -> vocab); the input is the embedded sequence.
    Parameters include the token and position embeddings (the head shares the token table).
    """
    name = name or f"gpt:{blocks}x{d}"
    b = _Builder(name)
    seq = _sequence(sample, name, d, GPT_SEQ)
    b.extra_params += GPT_SEQ * d  # position embedding (the token embedding is the head's weight)
    x = (INPUT, d, 1, 1)
    for i in range(blocks):
        p = f"h.{i}"
        qkv = b.linear(b.norm(x), f"{p}.attn.c_attn", 3 * d, seq=seq)
        a = b.linear(_attention(qkv), f"{p}.attn.c_proj", d, seq=seq)
        x = b.add(x, a)
        y = b.linear(b.linear(b.norm(x), f"{p}.mlp.c_fc", 4 * d, seq=seq), f"{p}.mlp.c_proj", d, seq=seq)
        x = b.add(x, y)
    b.linear(b.norm(x), "lm_head", vocab, bias=False, seq=seq)
    return b.net(name)


_IMAGE = (3, 224, 224)
_RESNETS = {"resnet-18": (False, [2, 2, 2, 2], 1), "resnet-34": (False, [3, 4, 6, 3], 1),
            "resnet-50": (True, [3, 4, 6, 3], 1), "resnet-101": (True, [3, 4, 23, 3], 1),
            "resnet-152": (True, [3, 8, 36, 3], 1), "wide-resnet-50-2": (True, [3, 4, 6, 3], 2),
            "wide-resnet-101-2": (True, [3, 4, 23, 3], 2)}
MODELS = {  # name -> (builder(sample), default per-sample input shape)
    "lenet": (lenet, (1, 32, 32)),
    "alexnet": (alexnet, _IMAGE),
    **{f"vgg-{c}": ((lambda s, c=c: vgg(c, s)), _IMAGE) for c in "abcde"},
    **{f"vgg-{c}-bn": ((lambda s, c=c: vgg(c, s, bn=True)), _IMAGE) for c in "abde"},
    **{n: ((lambda s, n=n, a=a: resnet(n, a[0], a[1], s, a[2])), _IMAGE) for n, a in _RESNETS.items()},
    "mlp": (mlp, (784,)),
    "transformer": (transformer, (512, 1024)),
    **{n: ((lambda s, n=n, bd=bd: gpt(bd[0], bd[1], s, n)), (GPT_SEQ, bd[1])) for n, bd in GPT_SIZES.items()},
}
ALIASES = {
    "vgg-11": "vgg-a", "vgg-13": "vgg-b", "vgg-16": "vgg-d", "vgg-19": "vgg-e",
    # torchvision's spellings
    "vgg11": "vgg-a", "vgg13": "vgg-b", "vgg16": "vgg-d", "vgg19": "vgg-e",
    "vgg11_bn": "vgg-a-bn", "vgg13_bn": "vgg-b-bn", "vgg16_bn": "vgg-d-bn", "vgg19_bn": "vgg-e-bn",
    "resnet18": "resnet-18", "resnet34": "resnet-34", "resnet50": "resnet-50", "resnet101": "resnet-101",
    "resnet152": "resnet-152", "wide_resnet50_2": "wide-resnet-50-2", "wide_resnet101_2": "wide-resnet-101-2",
    "gpt2-small": "gpt2",
}
_GPT = re.compile(r"^gpt:(\d+)x(\d+)$")


def canonical(name: str) -> str:
    """The zoo's own name for ``name`` (aliases resolved, lower case)."""
    key = name.strip().lower()
    return ALIASES.get(key, key)


def names() -> list[str]:
    return sorted(MODELS) + sorted(ALIASES)


def has(name: str) -> bool:
    key = canonical(name)
    return key in MODELS or bool(_GPT.match(key))


def build(name: str, input_shape=None) -> Net:
    """The layer table of a zoo model; ``input_shape`` is one sample's shape (default: the model's own)."""
    key = canonical(name)
    match = _GPT.match(key)
    if match:
        blocks, width = int(match[1]), int(match[2])
        if blocks < 1 or width < 1:
            raise OptionError(f"{{model}} {name}: write gpt:BLOCKSxWIDTH with positive numbers, e.g. gpt:24x1024")
        return gpt(blocks, width, tuple(input_shape or ()), key)
    if key not in MODELS:
        raise UsageError(f"unknown model {name!r}; built-in: {', '.join(sorted(MODELS))}, gpt:BLOCKSxWIDTH, "
                         "torchvision names (resnet50, vgg16, ...), torchvision:NAME, or module:path:Class")
    builder, sample = MODELS[key]
    return builder(tuple(input_shape or sample))
