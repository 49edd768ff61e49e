"""Tracing the built-in zoo gives the published layer shapes and parameter counts."""

import pytest
from torch import nn

from hetrain.errors import UsageError
from hetrain.planner.layers import Block
from hetrain.planner.trace import load_model, trace

PUBLISHED = {  # total parameters (torchvision / the papers)
    "lenet": 61_706, "alexnet": 61_100_840, "vgg-a": 132_863_336, "vgg-b": 133_047_848,
    "vgg-d": 138_357_544, "vgg-e": 143_667_240, "resnet-18": 11_689_512, "resnet-34": 21_797_672,
    "resnet-50": 25_557_032, "resnet-152": 60_192_808,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts(name):
    assert load_model(name).total_params == PUBLISHED[name]


def test_vgg16_layers():
    net = load_model("vgg-16")
    assert net.name == "vgg-d" and len(net.layers) == 16
    first, fc6 = net.layers[0], net.layers[13]
    assert (first.d_in, first.d_out, first.kernel, first.hw_in) == (3, 64, 9, 224 * 224)
    assert (fc6.kind, fc6.d_in, fc6.d_out) == ("linear", 25088, 4096)
    assert round(net.total_params / 1e6, 1) == 138.4


def test_vgg_c_has_one_by_one_convs():
    assert sum(la.kernel == 1 for la in load_model("vgg-c").layers if la.kind == "conv") == 3


def test_resnet50_structure():
    net = load_model("resnet-50")
    assert len(net.layers) == 54 and net.num_adds == 16
    blocks = [s for s in net.segments if isinstance(s, Block)]
    assert sum(1 for b in blocks if b.b) == 4  # one projection shortcut per stage
    assert all(len(b.a) == 3 for b in blocks)
    assert round(net.total_params / 1e6, 1) == 25.6
    conv1 = net.layers[0]
    assert (conv1.d_in, conv1.d_out, conv1.kernel, conv1.hw_out) == (3, 64, 49, 112 * 112)


def test_transformer_block_joins():
    net = load_model("transformer")
    assert [la.name for la in net.layers] == ["qkv", "proj", "fc1", "fc2"]
    assert net.num_adds == 2 and net.layers[0].hw_in == 512


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
