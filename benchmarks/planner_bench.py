"""Planner benchmark: HyPar's communication setting, a TPU-v2 + TPU-v3 array, and planning time.

Usage: .venv/bin/python benchmarks/planner_bench.py [--batch 256] [--hetero-batch 256]
Prints three markdown tables (the figures in docs/planner.md come from this script).
"""

from __future__ import annotations

import argparse
import time

from hetrain.planner.baselines import compare, searched
from hetrain.planner.devices import parse_array
from hetrain.planner.hierarchy import plan
from hetrain.planner.trace import load_model

HYPAR_PUBLISHED = {"alexnet": (2.00, 0.289), "vgg-a": (15.9, 1.47), "vgg-e": (17.2, 2.76)}  # GB/step, DP vs HyPar


def hypar_setting(batch: int) -> None:
    print(f"\n### HyPar setting: 16 equal accelerators (4 levels), volume objective, batch {batch}, 4 bytes/element\n")
    print("| model | DP GB | 2 types GB | 3 types GB | reduction 2 types | reduction 3 types "
          "| HyPar paper DP / HyPar GB | paper reduction |")
    print("|---|---|---|---|---|---|---|---|")
    devs = parse_array("a100:16")
    for name in ("alexnet", "vgg-a", "vgg-b", "vgg-c", "vgg-d", "vgg-e"):
        net = load_model(name)
        two = compare(net, batch, devs, "volume", 2, 4.0)
        three = plan(net, batch, devs, searched("volume", 3, 4.0))
        dp, t2, t3 = two["data-parallel"].comm_bytes / 1e9, two["plan"].comm_bytes / 1e9, three.comm_bytes / 1e9
        pub = HYPAR_PUBLISHED.get(name)
        paper = f"{pub[0]:.3g} / {pub[1]:.3g}" if pub else "-"
        paper_red = f"{pub[0] / pub[1]:.2f}x" if pub else "-"
        print(f"| {name} | {dp:.3f} | {t2:.3f} | {t3:.3f} | {dp / t2:.2f}x | {dp / t3:.2f}x | {paper} | {paper_red} |")


def hetero(batch: int) -> None:
    print(f"\n### TPU-v3 + TPU-v2, time objective, batch {batch}, 2 bytes/element\n")
    print("| array | model | plan step ms | compute / comm ms | ratio | vs DP | vs one weird trick | vs HyPar |")
    print("|---|---|---|---|---|---|---|---|")
    for spec in ("tpu-v3:4,tpu-v2:4", "tpu-v3:64,tpu-v2:64"):
        devs = parse_array(spec)
        for name in ("alexnet", "vgg-16", "vgg-19", "resnet-50", "resnet-152"):
            res = compare(load_model(name), batch, devs, "time", 3, 2.0)
            p = res["plan"]
            s = {k: v.step_s / p.step_s for k, v in res.items()}
            print(f"| {spec} | {name} | {p.step_s * 1e3:.3f} | {p.compute_s * 1e3:.3f} / {p.comm_s * 1e3:.3f} "
                  f"| {p.alpha:.3f} | {s['data-parallel']:.2f}x | {s['one-weird-trick']:.2f}x | {s['hypar']:.2f}x |")


def planning_time(batch: int) -> None:
    print(f"\n### Planning time, ResNet-152, batch {batch}, 1,024 devices (10 levels)\n")
    print("| array | levels | seconds (plan only) | seconds (plan + 3 baselines) |")
    print("|---|---|---|---|")
    net = load_model("resnet-152")
    for spec in ("a100:1024", "tpu-v3:512,tpu-v2:512"):
        devs = parse_array(spec)
        t0 = time.perf_counter()
        plan(net, batch, devs, searched("time", 3, 2.0))
        t1 = time.perf_counter()
        compare(net, batch, devs, "time", 3, 2.0)
        t2 = time.perf_counter()
        print(f"| {spec} | 10 | {t1 - t0:.2f} | {t2 - t1:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256, help="batch of the HyPar setting")
    parser.add_argument("--hetero-batch", type=int, default=256, help="batch of the TPU and timing tables")
    args = parser.parse_args()
    hypar_setting(args.batch)
    hetero(args.hetero_batch)
    planning_time(args.hetero_batch)


if __name__ == "__main__":
    main()
