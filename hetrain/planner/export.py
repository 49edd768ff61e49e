"""A plan with even splits as a torch tensor-parallel plan (``parallelize_module``'s Colwise/Rowwise styles).

torch's DTensor shards a dimension as ``torch.chunk`` does, so it cannot express
an uneven split (a heterogeneous array's ratio such as 0.797); HAP pads shards
for that, and hetrain's own executor (:func:`hetrain.planner.parallelize`) moves
the uneven pieces itself. Where a plan *is* expressible this module says how:

- every split even (ratio 0.5, each split dimension divisible by its group's size),
- at each depth of the hierarchy all groups choose the same types (a mesh dimension is uniform),
- a depth is either data parallel (every layer type I: the batch is split; wrap with DDP or FSDP
  over that mesh dimension) or tensor parallel (every layer II or III, Linear layers only:
  type III splits a layer's outputs = ``ColwiseParallel``, type II its inputs = ``RowwiseParallel``),
- at most one tensor-parallel depth.

:func:`export_plan` is pure (no torch): the mesh and a style name per layer, or a
:class:`NotExportable` reason. :func:`parallelize_plan` turns it into the dict that
``torch.distributed.tensor.parallel.parallelize_module`` takes, with the input and
output layouts that chain the layers (a Colwise layer's sharded output feeds a
Rowwise layer as it is; anything else is redistributed by DTensor).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetrain.errors import UsageError


class NotExportable(UsageError):
    """A plan that torch's tensor-parallel styles cannot express (the message says why)."""


@dataclass
class TensorParallelExport:
    mesh: list = field(default_factory=list)    # [(name, size)], outermost first: "dp0", "tp", ...
    styles: dict = field(default_factory=dict)  # layer name -> "colwise" | "rowwise"
    tp_dim: str | None = None

    def json(self) -> dict:
        return {"mesh": [list(m) for m in self.mesh], "styles": dict(self.styles), "tp_dim": self.tp_dim}


def _depths(plan):
    """Groups by depth, top first."""
    out, level = [], [plan]
    while level and level[0].assignment is not None:
        if any(g.assignment is None for g in level):
            raise NotExportable("the hierarchy is not a full binary tree (an odd number of devices somewhere); "
                                "a device mesh needs equal groups")
        out.append(level)
        level = [c for g in level for c in (g.left, g.right)]
    return out


def export_plan(net, plan) -> TensorParallelExport:
    """The plan as a mesh and per-layer styles, or :class:`NotExportable` saying why not."""
    depths = _depths(plan)
    export = TensorParallelExport()
    for depth, groups in enumerate(depths):
        types = groups[0].assignment.types
        if any(g.assignment.types != types for g in groups):
            raise NotExportable(f"at depth {depth} the groups choose different layer types; a mesh dimension "
                                "applies one choice to all")
        if any(abs(g.alpha - 0.5) > 1e-9 for g in groups):
            ratios = sorted({round(g.alpha, 3) for g in groups})
            raise NotExportable(f"at depth {depth} the split ratio is {ratios}, not 0.5: DTensor shards evenly "
                                "(torch.chunk), so an uneven split is a known limit; train it with "
                                "hetrain.planner.parallelize")
        size = 2
        if all(t == 0 for t in types):
            export.mesh.append((f"dp{depth}", size))
            continue
        if any(t == 0 for t in types):
            raise NotExportable(f"at depth {depth} some layers split the batch (type I) and others their "
                                "features; a tensor-parallel mesh dimension splits features only")
        if export.tp_dim is not None:
            raise NotExportable("more than one tensor-parallel depth; parallelize_module takes one 1-D mesh")
        export.tp_dim = "tp"
        export.mesh.append(("tp", size))
        for la, t in zip(net.layers, types):
            if la.kind != "linear":
                raise NotExportable(f"{la.name} is a convolution split by features; ColwiseParallel and "
                                    "RowwiseParallel are for Linear layers")
            dim = la.d_out if t == 2 else la.d_in
            if dim % size:
                raise NotExportable(f"{la.name}: {dim} features do not divide evenly over the mesh")
            export.styles[la.name] = "colwise" if t == 2 else "rowwise"
    return export


def parallelize_plan(export: TensorParallelExport, net) -> dict:
    """The ``parallelize_module`` plan for ``export`` (imports torch)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    styles, previous = {}, None
    names = [la.name for la in net.layers]
    for k, name in enumerate(names):
        style = export.styles.get(name)
        last = k == len(names) - 1
        sharded_in = previous == "colwise"  # a Colwise layer's output is its outputs' shard
        if style == "colwise":
            styles[name] = ColwiseParallel(input_layouts=Shard(-1) if sharded_in else Replicate(),
                                           output_layouts=Replicate() if last else Shard(-1))
        elif style == "rowwise":
            styles[name] = RowwiseParallel(input_layouts=Shard(-1) if sharded_in else Replicate(),
                                           output_layouts=Replicate())
        previous = style
    return styles
