"""Cost model of one level of the hierarchy: two halves exchanging tensor pieces.

At a level, a group of accelerators is split into a left half (share ``alpha``
of every split dimension) and a right half (share ``1 - alpha``). Each weighted
layer picks a type (HyPar/AccPar):

===== ============== =================================================
type  splits         partial sums reduced between halves (each side)
===== ============== =================================================
I     batch B        weight gradient, Di*Do*k elements
II    input dim Di   forward output, B*Do*HWout elements
III   output dim Do  backward error of the input, B*Di*HWin elements
===== ============== =================================================

A boundary tensor (an activation F and its error E, same shape B x D) is laid
out between the halves as ``R`` (rows = batch split), ``C`` (columns = feature
split) or ``F`` (full copy on both sides). After its intra-layer reduction a
layer of type I/II/III leaves its output as R/F/C, and needs its input as
R/C/F. Backward is the mirror image: the error a layer produces for its input
has the layout it needed its input in, and the error it needs for its output
has the layout it produced. Re-layout costs are what each side must *receive*
(:func:`relayout_fractions`); for ``alpha = 0.5`` they reproduce AccPar's
table (I->II a quarter of F plus a quarter of E, II->I half of E, ...).

Costs are kept as three metrics per element: the objective, seconds and bytes
on the wire (both directions summed). This module is pure Python.
"""

from __future__ import annotations

import math

R, C, F, NONE = 0, 1, 2, 3
LAYOUT_NAMES = ("R", "C", "F", "-")
TYPE_NAMES = ("I", "II", "III")
OUT = (R, F, C)   # layout of a type's output after its reduction (= layout of the output error it needs)
NEED = (R, C, F)  # layout a type needs its input in (= layout of the input error it produces)
OBJECTIVES = ("time", "volume")


def relayout_fractions(src: int, dst: int, alpha: float) -> tuple[float, float]:
    """Fractions of a tensor that the left and right halves receive to go from ``src`` to ``dst``.

    ``F`` as a source holds everything, ``NONE`` as a destination needs nothing.
    R<->C: each side lacks the other's rows of its own columns, ``alpha*(1-alpha)``.
    R/C->F: the left side lacks ``1-alpha`` of the tensor, the right side ``alpha``.
    """
    if src == dst or src == F or dst == NONE:
        return 0.0, 0.0
    if dst == F:
        return 1.0 - alpha, alpha
    both = alpha * (1.0 - alpha)
    return both, both


class LevelCost:
    """Per-element costs at one level; ``rel[src][dst]`` and ``both`` are (objective, seconds, bytes).

    ``left_bytes_per_s`` / ``right_bytes_per_s`` are the aggregate link bandwidths
    of each half (the exchange of a level is spread over all devices of a half).
    ``both`` is the cost of an exchange where each side receives the full tensor
    (the intra-layer reduction of partial sums).
    """

    __slots__ = ("alpha", "bytes_per_elem", "left_bytes_per_s", "right_bytes_per_s", "objective", "rel", "both")

    def __init__(self, alpha: float, bytes_per_elem: float, left_bytes_per_s: float,
                 right_bytes_per_s: float, objective: str = "time"):
        if objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"split ratio must lie in (0, 1), got {alpha}")
        self.alpha = alpha
        self.bytes_per_elem = bytes_per_elem
        self.left_bytes_per_s = left_bytes_per_s
        self.right_bytes_per_s = right_bytes_per_s
        self.objective = objective
        self.rel = [[self._metrics(*relayout_fractions(s, d, alpha)) for d in range(4)] for s in range(4)]
        self.both = self._metrics(1.0, 1.0)

    def _metrics(self, left: float, right: float) -> tuple[float, float, float]:
        b = self.bytes_per_elem
        seconds = max(_div(left * b, self.left_bytes_per_s), _div(right * b, self.right_bytes_per_s))
        nbytes = (left + right) * b
        return (seconds if self.objective == "time" else nbytes), seconds, nbytes


def _div(num: float, den: float) -> float:
    if num == 0.0 or math.isinf(den):
        return 0.0
    return num / den


def add3(a, b):
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def scale3(a, s: float):
    return (a[0] * s, a[1] * s, a[2] * s)


ZERO = (0.0, 0.0, 0.0)


def intra(lc: LevelCost, t: int, w_size: float, out_size: float, in_size: float, first: bool):
    """Intra-layer reduction of a type-``t`` layer: each side receives the full partial-sum tensor."""
    if t == 0:
        n = w_size
    elif t == 1:
        n = out_size
    else:
        n = 0.0 if first else in_size  # nobody needs the error of the network input
    return scale3(lc.both, n)


def forward_fanout(lc: LevelCost, src: int, needs: list[tuple[int, float]]):
    """Bring a tensor held as ``src`` to every layout in ``needs`` ((layout, elements) pairs).

    Exact under the model: either convert directly to each distinct layout, or
    make one full copy (after which every layout is free), whichever is cheaper.
    """
    sizes: dict[int, float] = {}
    for layout, n in needs:
        sizes[layout] = max(sizes.get(layout, 0.0), n)
    direct = ZERO
    for layout, n in sizes.items():
        direct = add3(direct, scale3(lc.rel[src][layout], n))
    if len(sizes) < 2:
        return direct
    via_full = scale3(lc.rel[src][F], max(sizes.values()))
    return via_full if via_full[0] < direct[0] else direct


def backward_accumulate(lc: LevelCost, contribs: list[tuple[int, float]], need: int):
    """Sum error contributions ((layout, elements) pairs) and deliver the sum in layout ``need``.

    Contributions in the same layout add locally; the rest are converted to one
    accumulation layout m, summed, and converted to ``need``; the best m wins.
    """
    if need == NONE or not contribs:
        return ZERO
    sizes: dict[int, float] = {}
    for layout, n in contribs:
        sizes[layout] = max(sizes.get(layout, 0.0), n)
    biggest = max(sizes.values())
    best = None
    for m in (R, C, F):
        total = scale3(lc.rel[m][need], biggest)
        for layout, n in sizes.items():
            total = add3(total, scale3(lc.rel[layout][m], n))
        if best is None or total[0] < best[0]:
            best = total
    return best


def single_edge(lc: LevelCost, src: int, err_need: int, t: int, n: float):
    """A tensor of ``n`` elements with one consumer of type ``t``: forward plus backward re-layout."""
    fwd = lc.rel[src][NEED[t]]
    bwd = lc.rel[NEED[t]][err_need]
    return ((fwd[0] + bwd[0]) * n, (fwd[1] + bwd[1]) * n, (fwd[2] + bwd[2]) * n)
