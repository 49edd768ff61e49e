"""Communication graphs for decentralized training, their mixing weights and spectral gap.

A :class:`Topology` is a directed graph on workers 0..n-1: ``in_neighbors[i]``
are the workers whose models i averages, ``out_neighbors[i]`` those it sends
its model to. Pure code: no process groups, no devices.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from hetrain.errors import UsageError

TOPOLOGIES = ("ring", "double_ring", "torus", "hypercube", "exponential", "complete")


@dataclass(frozen=True)
class Topology:
    name: str
    num_workers: int
    edges: frozenset  # (src, dst) pairs: src sends to dst

    @cached_property
    def in_neighbors(self) -> list[list[int]]:
        result = [[] for _ in range(self.num_workers)]
        for src, dst in sorted(self.edges):
            result[dst].append(src)
        return result

    @cached_property
    def out_neighbors(self) -> list[list[int]]:
        result = [[] for _ in range(self.num_workers)]
        for src, dst in sorted(self.edges):
            result[src].append(dst)
        return result

    @cached_property
    def is_symmetric(self) -> bool:
        return all((dst, src) in self.edges for src, dst in self.edges)

    @cached_property
    def is_doubly_stochastic(self) -> bool:
        """Whether :attr:`mixing_weights`' columns sum to 1 as its rows do (symmetric graphs, regular
        directed graphs such as the exponential graph): the plain mean is kept by mixing."""
        columns = np.zeros(self.num_workers)
        for i, (weights, own) in enumerate(self.mixing_weights):
            columns[i] += own
            for j, v in weights.items():
                if j != i:
                    columns[j] += v
        return bool(np.allclose(columns, 1.0, rtol=0, atol=1e-12))

    @cached_property
    def mixing_weights(self) -> list[tuple[dict[int, float], float]]:
        """Row i of the mixing matrix as (in-neighbour weights, self weight): O(edges) memory.

        Symmetric graphs get Metropolis-Hastings weights (doubly stochastic, so
        the average is preserved); directed graphs get uniform weights
        1 / (in-degree + 1), which are doubly stochastic when the graph is regular.
        The self weight is 1 - the row's sum, summed over a dense row as numpy sums
        it, so the values are the dense matrix's to the bit (the simulator builds
        tens of thousands of workers, whose dense matrix would not fit in memory).
        """
        n = self.num_workers
        degree = [len(self.in_neighbors[i]) for i in range(n)]
        symmetric = self.is_symmetric
        row = np.zeros(n)
        rows = []
        for i in range(n):
            ins = self.in_neighbors[i]
            values = [1.0 / (1 + max(degree[i], degree[j])) if symmetric else 1.0 / (1 + degree[i]) for j in ins]
            row[ins] = values
            own = float(1.0 - row.sum())
            row[ins] = 0.0
            rows.append(({j: (own if j == i else v) for j, v in zip(ins, values)}, own))
        return rows

    @cached_property
    def mixing_matrix(self) -> np.ndarray:
        """Row-stochastic W (dense, n x n): worker i's new model is sum_j W[i, j] * x_j; see :attr:`mixing_weights`."""
        n = self.num_workers
        w = np.zeros((n, n))
        for i, (weights, own) in enumerate(self.mixing_weights):
            for j, v in weights.items():
                w[i, j] = v
            w[i, i] = own
        return w

    @cached_property
    def spectral_gap(self) -> float:
        """1 - |second largest eigenvalue modulus| of W (larger mixes faster)."""
        if self.num_workers == 1:
            return 1.0
        moduli = np.sort(np.abs(np.linalg.eigvals(self.mixing_matrix)))[::-1]
        return float(1.0 - moduli[1])

    def distances_from(self, source: int) -> list[int]:
        """Shortest-path lengths (in hops) from ``source`` along edge directions; -1 if unreachable."""
        dist = [-1] * self.num_workers
        dist[source] = 0
        frontier = deque([source])
        while frontier:
            node = frontier.popleft()
            for nxt in self.out_neighbors[node]:
                if dist[nxt] < 0:
                    dist[nxt] = dist[node] + 1
                    frontier.append(nxt)
        return dist

    def is_strongly_connected(self) -> bool:
        if self.num_workers == 1:
            return True
        forward = self.distances_from(0)
        reverse = Topology(self.name, self.num_workers, frozenset((d, s) for s, d in self.edges))
        return min(forward) >= 0 and min(reverse.distances_from(0)) >= 0

    def describe(self) -> dict:
        degrees = [len(n) for n in self.in_neighbors]
        return {
            "topology": self.name,
            "num_workers": self.num_workers,
            "num_edges": len(self.edges),
            "symmetric": self.is_symmetric,
            "in_degree_min": min(degrees),
            "in_degree_max": max(degrees),
            "spectral_gap": self.spectral_gap,
            "in_neighbors": self.in_neighbors,
            "mixing_matrix": self.mixing_matrix.round(6).tolist(),
        }


def make_topology(name: str, num_workers: int) -> Topology:
    """Build a named topology, or read an edge-list file (lines ``src dst``); validate it."""
    if num_workers < 1:
        raise UsageError(f"the number of workers must be positive, got {num_workers}")
    key = name.replace("-", "_").lower()
    n = num_workers
    if key == "ring":
        edges = _symmetric((i, (i + 1) % n) for i in range(n))
    elif key == "double_ring":
        edges = _symmetric([(i, (i + 1) % n) for i in range(n)] + [(i, (i + 2) % n) for i in range(n)])
    elif key == "torus":
        rows, cols = _torus_shape(n)
        edges = _symmetric(
            [(r * cols + c, r * cols + (c + 1) % cols) for r in range(rows) for c in range(cols)]
            + [(r * cols + c, ((r + 1) % rows) * cols + c) for r in range(rows) for c in range(cols)]
        )
    elif key == "hypercube":
        if n & (n - 1):
            raise UsageError(f"hypercube needs a power-of-two number of workers, got {n}; use e.g. {1 << n.bit_length()}")
        edges = _symmetric((i, i ^ (1 << k)) for i in range(n) for k in range(n.bit_length() - 1))
    elif key == "exponential":
        hops = [1 << k for k in range(max(1, math.ceil(math.log2(n))))] if n > 1 else []
        edges = {(i, (i + h) % n) for i in range(n) for h in hops if h % n}
    elif key == "complete":
        edges = {(i, j) for i in range(n) for j in range(n) if i != j}
    else:
        edges = _read_edge_list(name, n)
        key = name
    edges = frozenset((s, d) for s, d in edges if s != d)
    topology = Topology(key, n, edges)
    if not topology.is_strongly_connected():
        raise UsageError(
            f"topology {name!r} on {n} workers is not strongly connected; every worker must reach every "
            "other along edges (add edges, or check the worker count)"
        )
    return topology


def _symmetric(pairs) -> set:
    edges = set()
    for src, dst in pairs:
        edges.add((src, dst))
        edges.add((dst, src))
    return edges


def _torus_shape(n: int) -> tuple[int, int]:
    rows = int(math.isqrt(n))
    while rows > 1 and n % rows:
        rows -= 1
    if rows < 2:
        raise UsageError(f"a 2-D torus needs rows x cols workers with rows, cols >= 2; {n} is not such a number")
    return rows, n // rows


def _read_edge_list(path: str, n: int) -> set:
    try:
        with open(path) as handle:
            lines = handle.read().splitlines()
    except OSError:
        raise UsageError(
            f"unknown topology {path!r}: choose one of {', '.join(TOPOLOGIES)} or give an edge-list file"
        ) from None
    edges = set()
    for number, line in enumerate(lines, start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        parts = text.replace(",", " ").split()
        try:
            src, dst = (int(p) for p in parts)
        except ValueError:
            raise UsageError(f"edge list {path!r} line {number}: expected 'SRC DST' (two worker indices)") from None
        if not (0 <= src < n and 0 <= dst < n):
            raise UsageError(
                f"edge list {path!r} line {number}: edge {src}->{dst} names a worker outside 0..{n - 1}; "
                "the file and --workers must agree"
            )
        edges.add((src, dst))
    if not edges:
        raise UsageError(f"edge list {path!r} has no edges; write one 'SRC DST' per line")
    return edges
