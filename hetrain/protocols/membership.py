"""Who is still in the job, and the graph the survivors use: pure membership logic.

When a worker dies, decentralized training should lose that worker's share of
the throughput, not the job. For Hop and D-PSGD the graph is *repaired*: each
dead worker's in-neighbours are joined to its out-neighbours, so every path
that ran through a dead worker becomes a direct edge and the survivors stay
strongly connected whenever they were connected through the dead. Mixing
weights are recomputed from the repaired graph (Metropolis-Hastings on
symmetric graphs). Repairing is vertex elimination: the result depends only on
the *set* of dead workers, not on the order they died in, so survivors that
learn of deaths at different moments converge on the same graph.

The runtime (:mod:`hetrain.runtime.hop`) and the simulator
(:mod:`hetrain.sim.hop_sim`) call the same functions.
"""

from __future__ import annotations

from collections.abc import Iterable

from hetrain.topology import Topology

ON_FAILURE = ("abort", "continue", "respawn")


def repair(topology: Topology, dead: Iterable[int]) -> Topology:
    """The graph of the survivors after ``dead`` died (dead workers keep their index, with no edges)."""
    dead = set(dead)
    if not dead:
        return topology
    edges = set(topology.edges)
    for d in sorted(dead):
        ins = [s for s, t in edges if t == d and s != d]
        outs = [t for s, t in edges if s == d and t != d]
        edges = {(s, t) for s, t in edges if d != s and d != t}
        edges |= {(a, b) for a in ins for b in outs if a != b}
    return Topology(f"{topology.name} without {sorted(dead)}", topology.num_workers, frozenset(edges))


def survivors_strongly_connected(topology: Topology, dead: Iterable[int]) -> bool:
    """Whether every survivor reaches every other along ``topology``'s edges (through survivors only)."""
    dead = set(dead)
    alive = [w for w in range(topology.num_workers) if w not in dead]
    if len(alive) <= 1:
        return True
    out = {w: [t for t in topology.out_neighbors[w] if t not in dead] for w in alive}
    inn = {w: [s for s in topology.in_neighbors[w] if s not in dead] for w in alive}
    return _reaches_all(alive[0], out, len(alive)) and _reaches_all(alive[0], inn, len(alive))


def _reaches_all(start: int, adjacency: dict, count: int) -> bool:
    seen, stack = {start}, [start]
    while stack:
        for nxt in adjacency[stack.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return len(seen) == count


def neighbour_weights(topology: Topology, rank: int) -> tuple[dict[int, float], float, list[int]]:
    """(in-neighbour weights, self weight, out-neighbours) of ``rank`` from ``topology``'s mixing weights."""
    weights, own = topology.mixing_weights[rank]
    return dict(weights), own, list(topology.out_neighbors[rank])
