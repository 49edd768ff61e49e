"""Which part of every tensor each device holds under a plan, and which pieces must move (pure Python).

A plan (a :class:`~hetrain.planner.hierarchy.GroupPlan` tree) gives every device
(leaf, left first) a *compute box* per layer: the ranges of samples, input
features and output features it multiplies. Each level cuts the range of the
layer's split dimension (type I: samples, II: inputs, III: outputs) at its
ratio, left half first; a join's layout (R: samples, C: features, F: whole)
cuts its tensor the same way, once for the forward value (m) and once for the
error (m'). A box here is ``(r0, r1, c0, c1)``: rows (samples, or a weight's
input features) by columns (features, or a weight's output features).

Two kinds of movement, as lists of ``Transfer(src, dst, box, level)``:

- :func:`fetch_plan`: complete values, held (possibly replicated) on some
  boxes, must reach other boxes; each missing piece comes from the holder
  closest in the hierarchy (same half first);
- :func:`reduce_plan`: partial sums on some boxes must be added up on target
  boxes; every overlapping contribution is sent.

A transfer's ``level`` is the depth at which its two devices part in the
hierarchy: the level whose exchange the cost model charges it to.
"""

from __future__ import annotations

from dataclasses import dataclass

Box = tuple  # (r0, r1, c0, c1)


@dataclass(frozen=True)
class Transfer:
    src: int
    dst: int
    box: Box
    level: int


def intersect(a: Box, b: Box):
    r0, r1, c0, c1 = max(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), min(a[3], b[3])
    return (r0, r1, c0, c1) if r0 < r1 and c0 < c1 else None


def subtract(a: Box, b: Box) -> list:
    """``a`` minus ``b`` as up to four disjoint boxes."""
    cut = intersect(a, b)
    if cut is None:
        return [a] if a[0] < a[1] and a[2] < a[3] else []
    out = []
    if a[0] < cut[0]:
        out.append((a[0], cut[0], a[2], a[3]))
    if cut[1] < a[1]:
        out.append((cut[1], a[1], a[2], a[3]))
    if a[2] < cut[2]:
        out.append((cut[0], cut[1], a[2], cut[2]))
    if cut[3] < a[3]:
        out.append((cut[0], cut[1], cut[3], a[3]))
    return out


def area(b: Box) -> int:
    return max(0, b[1] - b[0]) * max(0, b[3] - b[2])


def split_range(lo: int, hi: int, alpha: float):
    cut = lo + int(round(alpha * (hi - lo)))
    return (lo, cut), (cut, hi)


class Layout:
    """Per device: compute boxes of every layer, and the forward/error boxes of every join.

    ``compute[r][i]`` = ((b0, b1), (i0, i1), (o0, o1)); ``join_fwd[r][a]`` and
    ``join_err[r][a]`` = (b0, b1, c0, c1) over the join's (samples, channels);
    ``paths[r]`` = the left (0) / right (1) turns from the root to device r.
    """

    def __init__(self, net, batch: int, plan):
        self.net, self.batch = net, batch
        join_width = [net.layers[net.add_source(a)].d_out for a in range(net.num_adds)]
        full = [[(0, batch), (0, la.d_in), (0, la.d_out)] for la in net.layers]
        joins = [[(0, batch), (0, w)] for w in join_width]
        self.compute, self.join_fwd, self.join_err, self.paths, self.kinds = [], [], [], [], []
        self._walk(plan, full, joins, joins, ())

    def _walk(self, g, boxes, jf, je, path):
        if g.assignment is None:
            self.compute.append([tuple(b) for b in boxes])
            self.join_fwd.append([(*b, *c) for b, c in jf])
            self.join_err.append([(*b, *c) for b, c in je])
            self.paths.append(path)
            self.kinds.append(g.devices)
            return
        halves = []
        for side in (0, 1):
            nb = [list(b) for b in boxes]
            for i, t in enumerate(g.assignment.types):
                nb[i][t] = split_range(*boxes[i][t], g.alpha)[side]
            nf, ne = [list(b) for b in jf], [list(b) for b in je]
            for a, (m, m2) in enumerate(g.assignment.joins):
                for src, dst, layout in ((jf, nf, m), (je, ne, m2)):
                    if layout < 2:  # R: samples, C: channels, F: whole tensor on both sides
                        dst[a][layout] = split_range(*src[a][layout], g.alpha)[side]
            halves.append((nb, nf, ne))
        for side, (nb, nf, ne) in enumerate(halves):
            self._walk(g.left if side == 0 else g.right, nb, nf, ne, path + (side,))

    @property
    def world(self) -> int:
        return len(self.paths)

    def level(self, a: int, b: int) -> int:
        """Depth at which devices a and b are separated."""
        pa, pb = self.paths[a], self.paths[b]
        d = 0
        while d < min(len(pa), len(pb)) and pa[d] == pb[d]:
            d += 1
        return d


def fetch_plan(layout: Layout, held: list, need: list) -> list:
    """Transfers that bring complete values from ``held[s]`` boxes to every ``need[r]`` box."""
    out = []
    for dst in range(layout.world):
        missing = subtract(need[dst], held[dst]) if held[dst] is not None else [need[dst]]
        missing = [b for b in missing if area(b)]
        others = sorted((s for s in range(layout.world) if s != dst and held[s] is not None),
                        key=lambda s: (-layout.level(s, dst), s))
        for src in others:
            if not missing:
                break
            rest = []
            for piece in missing:
                got = intersect(piece, held[src])
                if got is None:
                    rest.append(piece)
                    continue
                out.append(Transfer(src, dst, got, layout.level(src, dst)))
                rest.extend(subtract(piece, got))
            missing = rest
        if missing:
            raise ValueError(f"device {dst} needs {missing}, which nobody holds")
    return out


def reduce_plan(layout: Layout, contrib: list, target: list) -> list:
    """Transfers that bring every other device's partial sums on ``contrib[s]`` into ``target[r]``."""
    out = []
    for dst in range(layout.world):
        if target[dst] is None or not area(target[dst]):
            continue
        for src in range(layout.world):
            if src == dst or contrib[src] is None:
                continue
            got = intersect(contrib[src], target[dst])
            if got is not None:
                out.append(Transfer(src, dst, got, layout.level(src, dst)))
    return out


def transferred_elements(transfers, inner: int = 1) -> int:
    """Elements moved by a list of transfers (``inner``: elements per (row, column) cell)."""
    return sum(area(t.box) for t in transfers) * inner


def allreduce_rounds(layout: Layout, boxes: list) -> list:
    """Rounds that leave on every rank ``r`` the sum of all ranks' partial sums over ``boxes[r]``
    (contributions and targets the same boxes), as the cost model charges them.

    The space is cut into cells held by the same ranks; each cell is reduced up the hierarchy by
    recursive halving (at a group whose two halves both hold it, the two halves' holders swap half of
    their overlap each and add: a reduce-scatter) and then gathered back down (the mirror image).
    So at every level each half receives the cell once in all (half while reducing, half while
    gathering), where sending every contribution to every holder made the top level carry one copy
    per pair. Returns ``[(mode, transfers), ...]`` in order, mode ``"add"`` or ``"copy"``, one level each.
    """
    depth = max((len(p) for p in layout.paths), default=0)
    scatter: list[list] = [[] for _ in range(max(depth, 1))]
    gather: list[list] = [[] for _ in range(max(depth, 1))]
    for cell, holders in _cells(boxes):
        if len(holders) > 1:
            _halve(layout, holders, cell, 0, scatter, gather)
    rounds = [("add", scatter[k]) for k in reversed(range(len(scatter))) if scatter[k]]
    return rounds + [("copy", gather[k]) for k in range(len(gather)) if gather[k]]


def _halve(layout, holders, cell, level, scatter, gather):
    """Reduce-scatter ``cell`` over ``holders`` (one group, from ``level`` down): [(rank, piece), ...]."""
    if len(holders) == 1:
        return [(holders[0], cell)]
    left = [r for r in holders if layout.paths[r][level] == 0]
    right = [r for r in holders if layout.paths[r][level] == 1]
    if not left or not right:
        return _halve(layout, left or right, cell, level + 1, scatter, gather)
    ours = _halve(layout, left, cell, level + 1, scatter, gather)
    theirs = _halve(layout, right, cell, level + 1, scatter, gather)
    out = []
    for ra, ca in ours:
        for rb, cb in theirs:
            both = intersect(ca, cb)
            if both is None:
                continue
            first, second = _cut_in_two(both)
            scatter[level].append(Transfer(rb, ra, first, level))
            gather[level].append(Transfer(ra, rb, first, level))
            out.append((ra, first))
            if second is not None:
                scatter[level].append(Transfer(ra, rb, second, level))
                gather[level].append(Transfer(rb, ra, second, level))
                out.append((rb, second))
    return out


def _cut_in_two(b: Box):
    if b[1] - b[0] >= 2:
        mid = (b[0] + b[1]) // 2
        return (b[0], mid, b[2], b[3]), (mid, b[1], b[2], b[3])
    if b[3] - b[2] >= 2:
        mid = (b[2] + b[3]) // 2
        return (b[0], b[1], b[2], mid), (b[0], b[1], mid, b[3])
    return b, None


def _cells(boxes: list):
    """Disjoint rectangles covering every box, each with the ranks whose box contains it; the cells of one
    set of ranks merged into one rectangle where they form one."""
    rows = sorted({v for b in boxes if b is not None and area(b) for v in (b[0], b[1])})
    cols = sorted({v for b in boxes if b is not None and area(b) for v in (b[2], b[3])})
    by_holders: dict[tuple, list] = {}
    for r0, r1 in zip(rows, rows[1:]):
        for c0, c1 in zip(cols, cols[1:]):
            cell = (r0, r1, c0, c1)
            holders = tuple(r for r, b in enumerate(boxes) if b is not None and area(b) and intersect(b, cell) == cell)
            if holders:
                by_holders.setdefault(holders, []).append(cell)
    out = []
    for holders, cells in by_holders.items():
        hull = (min(c[0] for c in cells), max(c[1] for c in cells), min(c[2] for c in cells), max(c[3] for c in cells))
        if area(hull) == sum(area(c) for c in cells):
            out.append((hull, list(holders)))
        else:
            out.extend((c, list(holders)) for c in cells)
    return out
