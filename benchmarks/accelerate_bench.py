"""Accelerate benchmark: one Accelerate loop under Accelerate's own DDP and under HetrainSync, one process slower.

    .venv/bin/python benchmarks/accelerate_bench.py --out runs/accelerate
    .venv/bin/python benchmarks/accelerate_bench.py --runs ddp prague prague-static --epochs 2

Each run is examples/accelerate_prague.py started by ``accelerate launch --multi_gpu`` on
``--processes`` CPU processes (gloo), process 0 ``--factor`` times slower: every batch
sleeps ``--compute-ms`` (process 0: times the factor) before its forward pass, in every run
alike. Runs: ``ddp`` is Accelerate's own DistributedDataParallel (``--protocol allreduce``,
which HetrainSync passes through; static shards); ``hop``, ``prague``, ``adpsgd``, ``dpsgd``,
``ps`` are HetrainSync over ``sync.shared_loader`` (each epoch shared out by speed);
``<protocol>-static`` keeps Accelerate's prepared loader (every process the same batches).
Columns of OUT/accelerate.md (keys of OUT/accelerate.json): time (``train_s``: the first
process's training start to the last one's end, the final average included, start-up left
out), wall (``wall_s``: the whole command), batches per process (process 0, the slow one,
first), accuracy of process 0's final model on the test set, ``ranks_agree`` (every process's
final floating-point state equal), and ``speedup``: ddp's time over the run's. The bound from
the factors alone, for the same samples, is (n - 1 + 1/factor) x factor / n (2.5x for 4
processes and 3x).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

from hetrain.testing.processes import run_in_own_session

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "accelerate_prague.py"
RUNS = ("ddp", "hop", "prague", "adpsgd", "dpsgd", "ps", "prague-static")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_one(name: str, args, out: Path) -> dict:
    run_dir = out / name
    protocol = "allreduce" if name == "ddp" else name.removesuffix("-static")
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR", "WORLD_SIZE", "RANK",
                                                             "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", HF_HOME=str(run_dir / "hf"))
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
               str(args.processes), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(free_port()), str(EXAMPLE), "--protocol", protocol,
               "--epochs", str(args.epochs), "--compute-ms", str(args.compute_ms),
               "--slowdown", f"0:{args.factor}x", "--out", str(run_dir)]
    if name.endswith("-static"):
        command.append("--static-shards")
    began = time.monotonic()
    returncode, output = run_in_own_session(command, cwd=ROOT, env=env, timeout_s=args.timeout)
    wall = time.monotonic() - began
    if returncode != 0:
        return {"run": name, "error": output[-2000:]}
    import torch

    ranks = [json.loads((run_dir / f"rank{r}.json").read_text()) for r in range(args.processes)]
    states = [torch.load(run_dir / f"rank{r}.pt") for r in range(args.processes)]
    agree = all(torch.equal(t, s[k]) for s in states[1:] for k, t in states[0].items() if t.is_floating_point())
    return {"run": name, "train_s": max(r["end"] for r in ranks) - min(r["start"] for r in ranks), "wall_s": wall,
            "batches": [r["batches"] for r in ranks], "accuracy": ranks[0]["test_accuracy"], "ranks_agree": agree}


def table(results: list[dict]) -> str:
    ddp = next((r for r in results if r["run"] == "ddp" and "error" not in r), None)
    lines = ["| run | time (s) | wall (s) | batches per process | accuracy | vs ddp | processes agree |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['run']} | failed | | | | | |")
            continue
        r["speedup"] = ddp["train_s"] / r["train_s"] if ddp else None
        speedup = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        lines.append(f"| {r['run']} | {r['train_s']:.2f} | {r['wall_s']:.1f} | {r['batches']} | {r['accuracy']:.4f} "
                     f"| {speedup} | {r['ranks_agree']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/accelerate")
    parser.add_argument("--runs", nargs="+", choices=RUNS, default=["ddp", "hop", "prague", "adpsgd", "prague-static"])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--compute-ms", type=float, default=50.0)
    parser.add_argument("--factor", type=float, default=3.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.runs:
        results.append(run_one(name, args, out))
        print(json.dumps({k: v for k, v in results[-1].items() if k != "error"}), flush=True)
    markdown = table(results)
    setup = {"processes": args.processes, "factor": args.factor, "compute_ms": args.compute_ms, "epochs": args.epochs}
    (out / "accelerate.json").write_text(json.dumps({"setup": setup, "results": results}, indent=1))
    (out / "accelerate.md").write_text(markdown)
    print(markdown)
    if any("error" in r for r in results):
        print("failed: " + ", ".join(r["run"] for r in results if "error" in r), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
