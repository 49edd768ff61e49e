"""Consensus with no gradients on the runtime's own D-PSGD (issue 36).

    .venv/bin/python benchmarks/consensus_checks.py --out runs/comm    # or: comm_bench.py consensus

- Outer Nesterov (lr 0.7, momentum 0.9), ``sync_every=1``, 60 exchanges: the spread of the workers'
  models over its start, beside plain gossip (no outer optimizer), on exponential and torus graphs
  of 8 and 16 workers. Goal: <= 1e-9 (plain gossip's rate).
- ``local_work="auto"`` with unequal local steps (worker 0 takes 2, worker 3 takes 5, the others 8):
  the distance of the consensus from the steps-weighted mean and from the plain mean, on ring,
  torus and exponential graphs of 8 workers. Goal: <= 1e-6 from the weighted mean.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from hetrain.jobs.local_job import run_local
from hetrain.testing.consensus_jobs import auto_gossip, gossip_only

EXCHANGES = 60


def _spread(models: torch.Tensor) -> float:
    return float((models - models.mean(0)).norm())


def consensus_report() -> dict:
    rows, lines = [], []
    for topology in ("exponential", "torus"):
        for workers in (8, 16):
            ratios = {}
            for outer in (True, False):
                results = run_local(gossip_only, workers, (topology, EXCHANGES, outer), timeout_s=120)
                starts = torch.stack([torch.from_numpy(s) for s, _ in results])
                models = torch.stack([torch.from_numpy(m) for _, m in results])
                ratios["nesterov" if outer else "plain"] = _spread(models) / _spread(starts)
            rows.append({"check": "outer", "topology": topology, "workers": workers, **ratios})
            lines.append(f"outer nesterov, {topology}, {workers} workers, {EXCHANGES} exchanges: spread/start "
                         f"{ratios['nesterov']:.3g} (plain gossip {ratios['plain']:.3g}; goal <= 1e-9: "
                         f"{'met' if ratios['nesterov'] <= 1e-9 else 'MISSED'})")
    for topology in ("ring", "torus", "exponential"):
        results = run_local(auto_gossip, 8, (topology, 150), timeout_s=120)
        starts = torch.stack([torch.from_numpy(s) for s, _, _ in results])
        models = torch.stack([torch.from_numpy(m) for _, m, _ in results])
        steps = torch.tensor([float(s) for _, _, s in results], dtype=torch.float64)
        weighted = (steps[:, None] * starts).sum(0) / steps.sum()
        consensus = models.mean(0)
        to_weighted = float((consensus - weighted).abs().max())
        to_plain = float((consensus - starts.mean(0)).abs().max())
        rows.append({"check": "auto", "topology": topology, "workers": 8, "from_weighted_mean": to_weighted,
                     "from_plain_mean": to_plain, "spread_over_start": _spread(models) / _spread(starts)})
        lines.append(f"local_work auto, {topology}, 8 workers: consensus {to_weighted:.3g} from the steps-weighted "
                     f"mean, {to_plain:.3g} from the plain mean (goal <= 1e-6 from the weighted: "
                     f"{'met' if to_weighted <= 1e-6 else 'MISSED'})")
    return {"rows": rows, "lines": lines}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/comm", help="writes OUT/consensus.json")
    args = parser.parse_args()
    report = consensus_report()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "consensus.json").write_text(json.dumps(report, indent=2) + "\n")
    print("\n".join(report["lines"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
