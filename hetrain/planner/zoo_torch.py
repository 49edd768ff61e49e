"""The zoo's models as plain ``nn.Module`` definitions (torch), built on the meta device.

The planner itself reads the pure-Python layer tables of :mod:`hetrain.planner.zoo`
(no torch import); these modules exist so that tests can trace them and check
that the tables are what tracing gives. Shapes follow the papers / torchvision:
LeNet-5 (32x32 input), AlexNet (the single-tower "one weird trick" variant
torchvision ships, 61.1M), VGG-A..E (Simonyan & Zisserman table 1), with or
without batch norm, ResNet-18/34/50/101/152 and Wide ResNet-50-2/101-2 (He et
al., with batch norm), the MLP, one transformer block and GPT-2-style decoders.
"""

from __future__ import annotations

import torch
from torch import nn

from hetrain.errors import UsageError

VGG_CONFIGS = {
    "a": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "b": [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "c": [64, 64, "M", 128, 128, "M", 256, 256, "1-256", "M", 512, 512, "1-512", "M", 512, 512, "1-512", "M"],
    "d": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
    "e": [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"],
}


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84),
                                        nn.ReLU(), nn.Linear(84, 10))

    def forward(self, x):
        return self.classifier(self.features(x))


class AlexNet(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        c = [(3, 64, 11, 4, 2), (64, 192, 5, 1, 2), (192, 384, 3, 1, 1), (384, 256, 3, 1, 1), (256, 256, 3, 1, 1)]
        layers = []
        for i, (ci, co, k, s, p) in enumerate(c):
            layers += [nn.Conv2d(ci, co, k, s, p), nn.ReLU()]
            if i in (0, 1, 4):
                layers.append(nn.MaxPool2d(3, 2))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(256 * 36, 4096), nn.ReLU(), nn.Linear(4096, 4096),
                                        nn.ReLU(), nn.Linear(4096, classes))

    def forward(self, x):
        return self.classifier(self.features(x))


class VGG(nn.Module):
    def __init__(self, config: str, classes: int = 1000, bn: bool = False):
        super().__init__()
        layers, ci = [], 3
        for v in VGG_CONFIGS[config]:
            if v == "M":
                layers.append(nn.MaxPool2d(2))
                continue
            k, co = (1, int(v[2:])) if isinstance(v, str) else (3, v)
            layers += [nn.Conv2d(ci, co, k, padding=k // 2), *([nn.BatchNorm2d(co)] if bn else []), nn.ReLU()]
            ci = co
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(512 * 49, 4096), nn.ReLU(), nn.Linear(4096, 4096),
                                        nn.ReLU(), nn.Linear(4096, classes))

    def forward(self, x):
        return self.classifier(self.features(x))


class Basic(nn.Module):
    expansion = 1

    def __init__(self, ci, width, stride):
        super().__init__()
        co = width
        self.body = nn.Sequential(nn.Conv2d(ci, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                  nn.Conv2d(width, co, 3, 1, 1, bias=False), nn.BatchNorm2d(co))
        self.down = _down(ci, co, stride)

    def forward(self, x):
        return torch.relu(self.body(x) + self.down(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, ci, planes, stride, width_factor: int = 1):
        super().__init__()
        co, width = planes * 4, planes * width_factor
        self.body = nn.Sequential(nn.Conv2d(ci, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                  nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(), nn.Conv2d(width, co, 1, bias=False), nn.BatchNorm2d(co))
        self.down = _down(ci, co, stride)

    def forward(self, x):
        return torch.relu(self.body(x) + self.down(x))


def _down(ci, co, stride):
    if stride == 1 and ci == co:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(ci, co, 1, stride, bias=False), nn.BatchNorm2d(co))


class ResNet(nn.Module):
    def __init__(self, block, counts, classes: int = 1000, width_factor: int = 1):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        blocks, ci = [], 64
        for stage, n in enumerate(counts):
            width = 64 * 2**stage
            for i in range(n):
                extra = (width_factor,) if width_factor != 1 else ()
                blocks.append(block(ci, width, 2 if (i == 0 and stage > 0) else 1, *extra))
                ci = width * block.expansion
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(ci, classes))

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


class MLP(nn.Module):
    """784 -> 4096 -> 4096 -> 4096 -> 10: a wide MLP whose layers are worth splitting."""

    def __init__(self, sizes=(784, 4096, 4096, 4096, 10)):
        super().__init__()
        layers = []
        for a, b in zip(sizes[:-1], sizes[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        self.net = nn.Sequential(*layers[:-1])

    def forward(self, x):
        return self.net(x)


class TransformerBlock(nn.Module):
    """Pre-norm block, d_model 1024, 16 heads, MLP 4096, on sequences of 512 tokens (input B x 512 x 1024)."""

    def __init__(self, d: int = 1024, heads: int = 16, hidden: int = 4096):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(a)
        return x + self.fc2(torch.relu(self.fc1(self.norm2(x))))


class GPTBlock(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.Module()
        self.attn.c_attn, self.attn.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Module()
        self.mlp.c_fc, self.mlp.c_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        qkv = self.attn.c_attn(self.ln_1(x)).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = nn.functional.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        x = x + self.attn.c_proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp.c_proj(nn.functional.gelu(self.mlp.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    """GPT-2-style decoder on embedded inputs (B x S x d); the head shares the token embedding's weight."""

    def __init__(self, blocks: int, d: int, vocab: int = 50257, seq: int = 1024):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.h = nn.ModuleList([GPTBlock(d, max(1, d // 64)) for _ in range(blocks)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, x):
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


_IMAGE = (3, 224, 224)
MODELS = {
    "lenet": (LeNet, (1, 32, 32)),
    "alexnet": (AlexNet, _IMAGE),
    **{f"vgg-{c}": ((lambda c=c: VGG(c)), _IMAGE) for c in "abcde"},
    **{f"vgg-{c}-bn": ((lambda c=c: VGG(c, bn=True)), _IMAGE) for c in "abde"},
    "resnet-18": (lambda: ResNet(Basic, [2, 2, 2, 2]), _IMAGE),
    "resnet-34": (lambda: ResNet(Basic, [3, 4, 6, 3]), _IMAGE),
    "resnet-50": (lambda: ResNet(Bottleneck, [3, 4, 6, 3]), _IMAGE),
    "resnet-101": (lambda: ResNet(Bottleneck, [3, 4, 23, 3]), _IMAGE),
    "resnet-152": (lambda: ResNet(Bottleneck, [3, 8, 36, 3]), _IMAGE),
    "wide-resnet-50-2": (lambda: ResNet(Bottleneck, [3, 4, 6, 3], width_factor=2), _IMAGE),
    "wide-resnet-101-2": (lambda: ResNet(Bottleneck, [3, 4, 23, 3], width_factor=2), _IMAGE),
    "mlp": (MLP, (784,)),
    "transformer": (TransformerBlock, (512, 1024)),
    "gpt2": (lambda: GPT(12, 768), (1024, 768)),
    "gpt2-medium": (lambda: GPT(24, 1024), (1024, 1024)),
}


def build(name: str):
    """(module on the meta device, per-sample input shape) of a zoo model (canonical name)."""
    if name not in MODELS:
        raise UsageError(f"no torch definition of {name!r}; defined: {', '.join(MODELS)}")
    factory, sample = MODELS[name]
    with torch.device("meta"):
        return factory(), sample
