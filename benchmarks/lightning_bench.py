"""Lightning benchmark: one unmodified LightningModule under Lightning's "ddp" and under hetrain's six protocols.

    .venv/bin/python benchmarks/lightning_bench.py --out runs/lightning
    .venv/bin/python benchmarks/lightning_bench.py --out runs/lightning --strategies ddp hop --epochs 2

Each run is examples/lightning_hop.py (conv net with BatchNorm on digits, batches of 32,
SGD with momentum), 4 CPU processes that Lightning starts, rank 0 ``--factor`` times
slower: every training batch sleeps ``--compute-ms`` (rank 0: times the factor) before
its forward pass, under every strategy alike (EmulatedCompute; sleep-emulated because 4
processes on a 2-core machine compute at uneven, noisy speeds). Every run trains
``--epochs`` passes over the training set: under ddp and allreduce each rank its static
shard, under the decentralized protocols shared out by speed (SharedBatches). Columns of
OUT/lightning.md (keys of OUT/lightning.json):

* time (``train_s``): from the first rank's training start to the last rank's training end
  (``on_train_start``/``on_train_end`` wall clocks; the end includes the protocol's final
  averaging); process start-up is left out (the same for every strategy);
* wall (``wall_s``): the whole command, start-up included;
* batches per rank (``batches``), slowest rank first;
* accuracy (``accuracy``): test accuracy of rank 0's final model (after ``fit()``; every
  rank holds the same model: ``ranks_agree``);
* vs ddp (``speedup``): ddp's time over this run's;
* ceiling (``ceiling``): ddp's time over this run's ideal time (``ideal_s``): its batches
  divided by the sum of the ranks' compute rates (batches per second of each rank's own
  compute, from each batch's start to its optimizer step: ``compute_per_batch_ms``), i.e.
  every rank computing all the time at the speed it showed, with no communication and no
  end-of-epoch or start-up costs. A speedup above it would be a measuring error. The nominal
  figure for ddp itself, from the factors alone, is (n - 1 + 1/factor) x factor / n = 2.5
  for 4 ranks and 3x (ddp at the slow rank's pace with free communication).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from hetrain.testing.processes import run_in_own_session

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "lightning_hop.py"
STRATEGIES = ("ddp", "allreduce", "hop", "dpsgd", "prague", "adpsgd", "ps")


def run_one(strategy: str, args, out: Path) -> dict:
    run_dir = out / strategy
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, str(EXAMPLE), "--strategy", strategy, "--devices", str(args.devices),
               "--epochs", str(args.epochs), "--compute-ms", str(args.compute_ms),
               "--slowdown", f"0:{args.factor}x", "--out", str(run_dir)]
    began = time.monotonic()
    returncode, output = run_in_own_session(command, cwd=ROOT, env=env, timeout_s=args.timeout)
    wall = time.monotonic() - began
    if returncode != 0:
        return {"strategy": strategy, "error": output[-2000:]}
    ranks = [json.loads((run_dir / f"rank{r}.json").read_text()) for r in range(args.devices)]
    return summarize(strategy, ranks, wall, run_dir)


def summarize(strategy: str, ranks: list[dict], wall: float, run_dir: Path) -> dict:
    import torch

    states = [torch.load(run_dir / f"rank{r['rank']}.pt") for r in ranks]
    agree = all(torch.equal(t, s[k]) for s in states[1:] for k, t in states[0].items() if t.is_floating_point())
    batches = [r["batches"] for r in ranks]
    rates = [r["batches"] / r["compute_s"] for r in ranks]  # batches per second of this rank's own compute
    return {"strategy": strategy, "train_s": max(r["end"] for r in ranks) - min(r["start"] for r in ranks),
            "wall_s": wall, "batches": batches, "samples": sum(r["samples"] for r in ranks),
            "accuracy": ranks[0]["test_accuracy"], "ranks_agree": agree,
            "compute_per_batch_ms": [1000 / rate for rate in rates],
            "ideal_s": sum(batches) / sum(rates)}  # every rank computing all the time, no communication


def table(results: list[dict], nominal: float) -> str:
    ddp = next((r for r in results if r["strategy"] == "ddp" and "error" not in r), None)
    lines = ["| strategy | time (s) | wall (s) | batches per rank | samples | accuracy | vs ddp | ceiling | ranks agree |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['strategy']} | failed | | | | | | | |")
            continue
        r["speedup"] = ddp["train_s"] / r["train_s"] if ddp else None
        r["ceiling"] = ddp["train_s"] / r["ideal_s"] if ddp and r["strategy"] != "ddp" else None
        speedup = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        ceiling = f"{r['ceiling']:.2f}x" if r["ceiling"] else f"{nominal:.2f}x (nominal)"
        lines.append(f"| {r['strategy']} | {r['train_s']:.2f} | {r['wall_s']:.1f} | {r['batches']} | {r['samples']} "
                     f"| {r['accuracy']:.4f} | {speedup} | {ceiling} | {r['ranks_agree']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/lightning")
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES))
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--compute-ms", type=float, default=50.0)
    parser.add_argument("--factor", type=float, default=3.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for strategy in args.strategies:
        results.append(run_one(strategy, args, out))
        print(json.dumps({k: v for k, v in results[-1].items() if k != "error"}), flush=True)
    n = args.devices
    nominal = (n - 1 + 1 / args.factor) * args.factor / n
    markdown = table(results, nominal)
    setup = {"devices": n, "factor": args.factor, "compute_ms": args.compute_ms, "epochs": args.epochs,
             "nominal_ceiling": nominal}
    (out / "lightning.json").write_text(json.dumps({"setup": setup, "results": results}, indent=1))
    (out / "lightning.md").write_text(markdown)
    print(markdown)


if __name__ == "__main__":
    main()
