"""How far apart the outer optimizer lets workers drift on heterogeneous data (issue 36), in a quadratic
model: each of 8 workers pulls toward its own target, H local SGD steps, then an exchange over the graph.

    .venv/bin/python benchmarks/outer_drift.py            # ring, torus, complete; prints a table

Rules: ``none`` (plain averaging every H steps), ``old`` (each worker steps its own anchor with
``anchor - average`` after the exchange: hetrain before issue 36), ``atc`` (each worker steps its anchor
with its own pseudo-gradient, then the exchange averages: hetrain since issue 36), ``atc+m`` (the same,
the momentum buffers averaged too). Reports the averaged model's excess loss (last 50 exchanges) and the
consensus distance at the end. Pure numpy: seconds.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from hetrain.topology import make_topology

RULES = ("none", "old", "atc", "atc+m")


def run(rule: str, topology: str, n: int = 8, steps: int = 8, lr: float = 0.05, outer_lr: float = 0.7,
        momentum: float = 0.9, exchanges: int = 300, dim: int = 20, noise: float = 0.5, seed: int = 0):
    rng = np.random.default_rng(seed)
    targets = rng.normal(size=(n, dim)) * 2
    mixing = make_topology(topology, n).mixing_matrix
    x = np.zeros((n, dim))
    anchor, buf, losses = x.copy(), np.zeros((n, dim)), []
    best = 0.5 * ((targets.mean(0) - targets) ** 2).sum(1).mean()
    for _ in range(exchanges):
        for _ in range(steps):
            x = x - lr * ((x - targets) + noise * rng.normal(size=(n, dim)))
        if rule == "none":
            anchor = mixing @ x
        elif rule == "old":
            pseudo = anchor - mixing @ x
            buf = momentum * buf + pseudo
            anchor = anchor - outer_lr * (pseudo + momentum * buf)
        else:
            pseudo = anchor - x
            if rule == "atc+m":
                buf = mixing @ buf
            buf = momentum * buf + pseudo
            anchor = mixing @ (anchor - outer_lr * (pseudo + momentum * buf))
        x = anchor.copy()
        losses.append(0.5 * ((x.mean(0) - targets) ** 2).sum(1).mean() - best)
    return float(np.mean(losses[-50:])), float(np.sqrt(((x - x.mean(0)) ** 2).sum(1).mean()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topologies", default="ring,torus,complete")
    args = parser.parse_args()
    print("| graph | rule | excess loss of the averaged model | consensus distance |")
    print("|---|---|---|---|")
    for topology in args.topologies.split(","):
        for rule in RULES:
            loss, spread = run(rule, topology)
            print(f"| {topology} | {rule} | {loss:.4g} | {spread:.3g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
