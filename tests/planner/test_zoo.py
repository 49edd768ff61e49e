"""The zoo's pure-Python layer tables: published parameter counts, and exactly what tracing gives."""

import subprocess
import sys

import pytest
from torch import nn

from hetrain.errors import UsageError
from hetrain.planner import zoo, zoo_torch
from hetrain.planner.layers import Block
from hetrain.planner.models import load
from hetrain.planner.trace import trace

PUBLISHED = {  # total parameters (torchvision / the papers / Hugging Face GPT-2)
    "lenet": 61_706, "alexnet": 61_100_840, "vgg-a": 132_863_336, "vgg-b": 133_047_848,
    "vgg-d": 138_357_544, "vgg-e": 143_667_240, "resnet-18": 11_689_512, "resnet-34": 21_797_672,
    "resnet-50": 25_557_032, "resnet-101": 44_549_160, "resnet-152": 60_192_808,
    "vgg16_bn": 138_365_992, "wide_resnet50_2": 68_883_240, "wide_resnet101_2": 126_886_696,
    "gpt2": 124_439_808, "gpt2-medium": 354_823_168, "gpt2-large": 774_030_080, "gpt2-xl": 1_557_611_200,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts(name):
    assert load(name).total_params == PUBLISHED[name]


@pytest.mark.parametrize("name", sorted(zoo_torch.MODELS))
def test_tables_equal_tracing(name):
    module, sample = zoo_torch.build(name)
    traced = trace(module, sample, name)
    table = zoo.build(name)
    assert table.layers == traced.layers
    assert table.nodes == traced.nodes
    assert table.total_params == traced.total_params


@pytest.mark.contract
def test_zoo_needs_no_torch(processes):
    code = ("import sys; from hetrain.planner import plan_model; "
            "r = plan_model('resnet50', 64, 'tpu-v3:2,tpu-v2:2'); "
            "assert 'torch' not in sys.modules, 'torch was imported'; print(r.net.name)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "resnet-50"


@pytest.mark.parametrize("alias,name", [("vgg16", "vgg-d"), ("vgg-16", "vgg-d"), ("resnet50", "resnet-50"),
                                        ("ResNet152", "resnet-152"), ("alexnet", "alexnet"),
                                        ("vgg11_bn", "vgg-a-bn"), ("gpt2-small", "gpt2")])
def test_torchvision_style_aliases(alias, name):
    assert load(alias).name == name


def test_vgg16_layers():
    net = load("vgg-16")
    assert net.name == "vgg-d" and len(net.layers) == 16
    first, fc6 = net.layers[0], net.layers[13]
    assert (first.d_in, first.d_out, first.kernel, first.hw_in) == (3, 64, 9, 224 * 224)
    assert (fc6.kind, fc6.d_in, fc6.d_out) == ("linear", 25088, 4096)


def test_vgg_c_has_one_by_one_convs():
    assert sum(la.kernel == 1 for la in load("vgg-c").layers if la.kind == "conv") == 3


def test_resnet50_structure():
    net = load("resnet-50")
    assert len(net.layers) == 54 and net.num_adds == 16
    blocks = [s for s in net.segments if isinstance(s, Block)]
    assert sum(1 for b in blocks if b.b) == 4  # one projection shortcut per stage
    assert all(len(b.a) == 3 for b in blocks)
    conv1 = net.layers[0]
    assert (conv1.d_in, conv1.d_out, conv1.kernel, conv1.hw_out) == (3, 64, 49, 112 * 112)


def test_resnet_at_other_input_sizes():
    net = load("resnet-50", (3, 32, 32))
    assert net.layers[0].hw_out == 16 * 16 and net.layers[-1].d_in == 2048


def test_gpt_by_blocks_and_width():
    net = load("gpt:24x1024")
    assert net.num_adds == 48 and len(net.layers) == 4 * 24 + 1
    assert net.total_params == PUBLISHED["gpt2-medium"]
    c_attn, head = net.layers[0], net.layers[-1]
    assert (c_attn.d_in, c_attn.d_out, c_attn.hw_in) == (1024, 3072, 1024)
    assert (head.name, head.d_out, head.bias) == ("lm_head", 50257, False)
    assert load("gpt:2x64", (128,)).layers[0].hw_in == 128


def test_transformer_block_joins():
    net = load("transformer")
    assert [la.name for la in net.layers] == ["qkv", "proj", "fc1", "fc2"]
    assert net.num_adds == 2 and net.layers[0].hw_in == 512


@pytest.mark.parametrize("name,shape,needle", [
    ("vgg-16", (3, 32, 32), "classifier reads"), ("alexnet", (1, 224, 224), "reads 3xHxW"),
    ("gpt2", (128, 512), "width 768"), ("gpt:0x64", None, "positive"), ("alexnet", (3, 32, 32), "too small"),
    ("mobilenet_v2", None, "unknown model"),
])
def test_bad_zoo_input(name, shape, needle):
    with pytest.raises(UsageError, match=needle):
        load(name, shape)


class _Concat(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(8, 2)

    def forward(self, x):
        import torch

        return self.c(torch.cat([self.a(x), self.b(x)], dim=1))


def test_unsupported_merge_is_a_usage_error():
    with pytest.raises(UsageError, match="other than an addition"):
        trace(_Concat(), (4,), "concat")


def test_no_weighted_layers_is_a_usage_error():
    with pytest.raises(UsageError, match="no Linear or Conv2d"):
        trace(nn.Sequential(nn.ReLU()), (4,), "relu")
