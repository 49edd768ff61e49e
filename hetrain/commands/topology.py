"""`hetrain topology NAME N`: print a graph's neighbours, mixing weights and spectral gap."""

from __future__ import annotations

import json

HELP = "show a communication graph: neighbours, mixing weights, spectral gap"


def add_arguments(parser) -> None:
    parser.add_argument("name", help="ring, double_ring, torus, hypercube, exponential, complete, or an edge-list file")
    parser.add_argument("workers", type=int, help="number of workers")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args) -> int:
    from hetrain.topology import make_topology

    topology = make_topology(args.name, args.workers)
    info = topology.describe()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"{info['topology']}: {info['num_workers']} workers, {info['num_edges']} directed edges, "
          f"{'symmetric' if info['symmetric'] else 'directed'}, in-degree {info['in_degree_min']}"
          f"..{info['in_degree_max']}, spectral gap {info['spectral_gap']:.4f}")
    w = topology.mixing_matrix
    for i in range(topology.num_workers):
        weights = ", ".join(f"{j}:{w[i, j]:.3f}" for j in topology.in_neighbors[i])
        print(f"  worker {i:>3}  self {w[i, i]:.3f}  in-neighbours {weights}")
    return 0
