"""What the planner knows of a network: weighted layers, residual joins, and their order.

A :class:`Net` is a DAG of *nodes*: weighted layers (Linear or Conv2d) and
joins (element-wise additions of two paths). Everything else (activations,
pooling, normalisation, reshapes) is layout-preserving and free in the model.
The DAG must decompose into a sequence of *segments*: a single layer
(:class:`Chain`) or a residual block (:class:`Block`): a fork tensor read by
two branches, each a chain of zero or more layers, which an addition joins.
That covers MLPs, VGG, ResNets and transformer blocks.

Shapes are per sample: a convolution has ``d_in``/``d_out`` channels, ``kernel``
= kh*kw and spatial sizes ``hw_in``/``hw_out`` (H*W); a Linear on a sequence
has the sequence length as ``hw_in = hw_out``. A traced or zoo convolution also
records its stride, padding and dilation (what the executor re-creates).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetrain.errors import UsageError

INPUT = -1  # the producer id of the network input


@dataclass(frozen=True)
class Layer:
    """A weighted layer: y = x W over ``d_in`` -> ``d_out`` features (channels), per sample."""

    name: str
    kind: str  # "linear" or "conv"
    d_in: int
    d_out: int
    kernel: int = 1
    hw_in: int = 1
    hw_out: int = 1
    bias: bool = True
    # convolutions as traced (or built by the zoo): (h, w) stride, (h, w) padding or torch's 'same'/'valid',
    # (h, w) dilation and the padding mode; None where unknown (hand-built tables: the executor then infers a
    # stride and padding from the sizes). The cost model does not read them; the executor does.
    stride: tuple | None = None
    padding: tuple | str | None = None
    dilation: tuple | None = None
    padding_mode: str = "zeros"

    @property
    def weight_elems(self) -> int:
        return self.d_in * self.d_out * self.kernel

    @property
    def params(self) -> int:
        return self.weight_elems + (self.d_out if self.bias else 0)

    def flops(self, batch: float) -> float:
        """Forward multiply-add FLOPs (2 per MAC) for ``batch`` samples."""
        return 2.0 * batch * self.d_in * self.d_out * self.kernel * self.hw_out


@dataclass(frozen=True)
class Node:
    """A layer (``index`` into ``Net.layers``) or a join (``index`` into the joins), with producer node ids."""

    kind: str  # "layer" or "add"
    index: int
    producers: tuple[int, ...]


@dataclass(frozen=True)
class Chain:
    layer: int


@dataclass(frozen=True)
class Block:
    """Fork -> branch ``a`` (>= 1 layer) and branch ``b`` (0 layers = identity) -> join ``add``."""

    a: tuple[int, ...]
    b: tuple[int, ...]
    add: int


@dataclass
class Net:
    name: str
    layers: list[Layer]
    nodes: list[Node]
    total_params: int = 0
    segments: list = field(default_factory=list)

    def __post_init__(self):
        if not self.layers:
            raise UsageError(f"model {self.name!r} has no Linear or Conv2d layers; the planner needs weighted layers")
        self.segments = _segments(self)
        if not self.total_params:
            self.total_params = sum(layer.params for layer in self.layers)

    @property
    def num_adds(self) -> int:
        return sum(1 for n in self.nodes if n.kind == "add")

    def add_source(self, add: int) -> int:
        """The layer whose output size sizes join ``add`` (last layer of its longer branch)."""
        for seg in self.segments:
            if isinstance(seg, Block) and seg.add == add:
                return seg.a[-1]
        raise KeyError(add)


def chain_net(name: str, layers: list[Layer]) -> Net:
    """A plain chain of layers."""
    nodes = [Node("layer", i, (i - 1,) if i else (INPUT,)) for i in range(len(layers))]
    return Net(name, list(layers), nodes)


def _segments(net: Net) -> list:
    consumers: dict[int, list[int]] = {}
    for nid, node in enumerate(net.nodes):
        for p in node.producers:
            consumers.setdefault(p, []).append(nid)

    def follow(start: int, prev: int):
        path, nid = [], start
        while net.nodes[nid].kind == "layer":
            node = net.nodes[nid]
            if node.producers != (prev,):
                raise _unsupported(net, f"layer {net.layers[node.index].name} reads several tensors")
            path.append(node.index)
            nxt = consumers.get(nid, [])
            if len(nxt) != 1:
                raise _unsupported(net, f"the output of {net.layers[node.index].name} is read {len(nxt)} times "
                                        "inside a residual branch")
            prev, nid = nid, nxt[0]
        return tuple(path), nid

    segments, cur, seen = [], INPUT, 0
    while consumers.get(cur):
        cons = consumers[cur]
        head = net.nodes[cons[0]]
        if len(cons) == 1 and head.kind == "layer":
            segments.append(Chain(head.index))
            cur, seen = cons[0], seen + 1
            continue
        if len(cons) != 2:
            raise _unsupported(net, f"a tensor is read by {len(cons)} layers or joins (only forks into two paths "
                                    "that an addition joins are supported)")
        (pa, add_a), (pb, add_b) = follow(cons[0], cur), follow(cons[1], cur)
        if add_a != add_b or len(net.nodes[add_a].producers) != 2:
            raise _unsupported(net, "two paths from a fork do not meet at one addition")
        if not pa and not pb:
            raise _unsupported(net, "a join adds a tensor to itself")
        if len(pb) > len(pa):
            pa, pb = pb, pa
        segments.append(Block(pa, pb, net.nodes[add_a].index))
        cur, seen = add_a, seen + len(pa) + len(pb) + 1
    if seen != len(net.nodes):
        raise _unsupported(net, f"only {seen} of {len(net.nodes)} layers and joins lie on the path to the output")
    return segments


def _unsupported(net: Net, why: str) -> UsageError:
    return UsageError(f"model {net.name!r}: unsupported graph: {why}; the planner handles chains and "
                      "residual blocks (fork, two branches, addition)")
