"""Planner benchmarks (measure, don't test). Each section prints markdown tables for docs/guides/planner.md.

    python benchmarks/planner_bench.py speed     [--repeats 5]   # planning time vs devices (8..4,096) and layers
    python benchmarks/planner_bench.py command   [--repeats 5]   # whole `hetrain plan` command, every zoo model
    python benchmarks/planner_bench.py headline  [--repeats 20]  # the goal's case: ResNet-152, 1,024 devices
    python benchmarks/planner_bench.py hypar                      # like for like with HyPar's published figures
    python benchmarks/planner_bench.py search                     # look-ahead vs level by level (AccPar shapes, zoo)
    python benchmarks/planner_bench.py tpu                        # TPU-v3 + TPU-v2, time objective
    python benchmarks/planner_bench.py memory                     # when memory binds
    python benchmarks/planner_bench.py measure   [--workers 2 4]  # hetrain profile + hetrain plan --measure
    python benchmarks/planner_bench.py train     [--repeats 1]    # hetrain plan --train, 300 steps, 5 plans

Times are wall-clock on whatever machine runs this; the figures in docs/guides/planner.md were taken on a
shared 2-core machine, so each is the minimum and median of several repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hetrain.errors import UsageError  # noqa: E402
from hetrain.planner.api import compare_plans  # noqa: E402
from hetrain.planner.baselines import compare, searched  # noqa: E402
from hetrain.planner.devices import parse_array  # noqa: E402
from hetrain.planner.hierarchy import PlanConfig, plan  # noqa: E402
from hetrain.planner.layers import Layer, chain_net  # noqa: E402
from hetrain.planner.models import load  # noqa: E402

# HyPar (HPCA'19) communication per step, data parallelism / HyPar, GB (16 accelerators)
HYPAR_PUBLISHED = {"vgg-a": (15.9, 1.47), "vgg-e": (17.2, 2.76)}
HYPAR_ALEXNET_DP_GB = 2.00


def _conv(name, ci, hi, k, co, ho):
    return Layer(name, "conv", ci, co, k * k, hi * hi, ho * ho)


def accpar_alexnet():
    """AlexNet as the AccPar authors describe it (linghaosong/AccPar, networks/Alexnet.txt)."""
    return chain_net("accpar-alexnet", [
        _conv("conv1", 3, 224, 11, 96, 55), _conv("conv2", 96, 55, 5, 256, 27), _conv("conv3", 256, 27, 3, 384, 13),
        _conv("conv4", 384, 13, 3, 384, 13), _conv("conv5", 384, 13, 3, 256, 6), Layer("fc1", "linear", 9216, 4096),
        Layer("fc2", "linear", 4096, 4096), Layer("fc3", "linear", 4096, 1000)])


def accpar_vgg11():
    """VGG-11 as the AccPar authors describe it (networks/Vgg11.txt; output sizes after pooling)."""
    c = [("conv1", 3, 224, 64, 112), ("conv2", 64, 112, 128, 56), ("conv31", 128, 56, 256, 56),
         ("conv32", 256, 56, 256, 28), ("conv41", 256, 28, 512, 28), ("conv42", 512, 28, 512, 14),
         ("conv51", 512, 14, 512, 14), ("conv52", 512, 14, 512, 7)]
    layers = [_conv(n, ci, hi, 3, co, ho) for n, ci, hi, co, ho in c]
    layers += [Layer("fc1", "linear", 25088, 4096), Layer("fc2", "linear", 4096, 4096),
               Layer("fc3", "linear", 4096, 1000)]
    return chain_net("accpar-vgg11", layers)


def _times(fn, repeats):
    """(min, median, fits) over ``repeats`` runs; a plan that does not fit is timed up to its error."""
    out, fits = [], True
    for _ in range(repeats):
        t0 = time.perf_counter()
        try:
            fn()
        except UsageError:
            fits = False
        out.append(time.perf_counter() - t0)
    return min(out), statistics.median(out), fits


def _ms(t):
    return f"{t[0] * 1e3:.0f} / {t[1] * 1e3:.0f}" + ("" if t[2] else " (no fit)")


def speed(repeats: int) -> None:
    print(f"\n### Planning time (ms, min / median of {repeats}), batch 512, greedy search, memory enforced\n")
    print("| model | layers | devices | plan | plan + 3 baselines | plan with look-ahead (width 4) |")
    print("|---|---|---|---|---|---|")
    for name in ("alexnet", "resnet-50", "resnet-152", "gpt2-xl"):
        net = load(name)
        for n in (8, 64, 512, 1024, 4096):
            for spec in (f"a100:{n}", f"tpu-v3:{n // 2},tpu-v2:{n // 2}"):
                devs = parse_array(spec)
                opts = dict(objective="time", types=3, bytes_per_elem=2.0, optimizer="adam", state_bytes=4.0,
                            fit_memory=True)
                only = _times(lambda n=net, d=devs, o=opts: plan(n, 512, d, searched(**o)), repeats)
                every = _times(lambda n=net, d=devs, o=opts: compare(n, 512, d, **o), repeats)
                look = _times(lambda n=net, d=devs, o=opts: plan(n, 512, d, searched(**o, search="lookahead")),
                              max(1, repeats // 2))
                print(f"| {name} | {len(net.layers)} | {spec} | {_ms(only)} | {_ms(every)} | {_ms(look)} |", flush=True)


def headline(repeats: int) -> None:
    """The issue's goal case: plan and three baselines, ResNet-152, batch 512, tpu-v3:512,tpu-v2:512.

    Run it on two trees in turn (copy this file into the other tree's benchmarks/) to compare them
    side by side on a shared machine; CPU time is printed too, since waiting for the CPU is not planning.
    """
    net, devs = load("resnet-152"), parse_array("tpu-v3:512,tpu-v2:512")
    compare(net, 512, devs)  # caches of the net (index, layouts) are filled once per process
    wall, cpu = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        plans = compare(net, 512, devs)
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    trials = ", ".join(f"{name} {p.ratio_trials}" for name, p in plans.items())
    print(f"| {ROOT.name} | {min(wall) * 1e3:.0f} / {statistics.median(wall) * 1e3:.0f} | "
          f"{min(cpu) * 1e3:.0f} / {statistics.median(cpu) * 1e3:.0f} | {trials} |", flush=True)


def command(repeats: int) -> None:
    print(f"\n### Whole `hetrain plan` command (s, min / median of {repeats}), batch 512, "
          "tpu-v3:512,tpu-v2:512 (1,024 devices)\n")
    print("| model | seconds | torch imported |")
    print("|---|---|---|")
    from hetrain.planner import zoo

    for name in sorted(zoo.MODELS):
        argv = [sys.executable, "-c", "import sys; from hetrain.cli import main; rc = main(sys.argv[1:]); "
                "print('TORCH' if 'torch' in sys.modules else 'NOTORCH', file=sys.stderr); sys.exit(rc)",
                "plan", "--model", name, "--batch", "512", "--devices", "tpu-v3:512,tpu-v2:512"]
        times, torch_seen = [], False
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
            times.append(time.perf_counter() - t0)
            torch_seen |= "NOTORCH" not in out.stderr
            if out.returncode not in (0, 2):
                raise SystemExit(out.stderr)
        note = "" if out.returncode == 0 else " (does not fit: one-line error)"
        print(f"| {name}{note} | {min(times):.2f} / {statistics.median(times):.2f} | {'yes' if torch_seen else 'no'} |",
              flush=True)


def hypar() -> None:
    devs = parse_array("a100:16")
    print("\n### HyPar's setting: 16 equal accelerators (4 levels), volume objective, 4 bytes/element, "
          "bytes received by both halves of every pair\n")
    print("| model | params | batch | DP GB | 2 types GB | 3 types GB | DP / 2 types | DP / 3 types | 2 types / 3 types |")
    print("|---|---|---|---|---|---|---|---|---|")
    nets = [load(n) for n in ("alexnet", "vgg-a", "vgg-b", "vgg-c", "vgg-d", "vgg-e")] + [accpar_alexnet()]
    for net in nets:
        for batch in (32, 64, 128, 256, 512):
            dp, two, three = _volumes(net, batch, devs)
            print(f"| {net.name} | {net.total_params / 1e6:.1f}M | {batch} | {dp:.3f} | {two:.3f} | {three:.3f} "
                  f"| {dp / two:.2f}x | {dp / three:.2f}x | {two / three:.2f}x |", flush=True)
    print("\nHyPar's published figures (GB per step, 16 accelerators): "
          + ", ".join(f"{k}: DP {v[0]}, HyPar {v[1]} ({v[0] / v[1]:.2f}x)" for k, v in HYPAR_PUBLISHED.items())
          + f"; AlexNet DP {HYPAR_ALEXNET_DP_GB} GB, i.e. {HYPAR_ALEXNET_DP_GB * 1e9 / 120 / 1e6:.1f}M weights "
          "at 120 bytes per weight")


def _volumes(net, batch, devs):
    two = compare(net, batch, devs, "volume", 2, 4.0)
    three = plan(net, batch, devs, searched("volume", 3, 4.0))
    return two["data-parallel"].comm_bytes / 1e9, two["plan"].comm_bytes / 1e9, three.comm_bytes / 1e9


def search() -> None:
    print("\n### Look-ahead against level by level (objective of the whole plan; gain = 1 - look-ahead / greedy)\n")
    print("| model | devices | batch | objective | types | greedy | look-ahead w4 d1 | gain | w8 d2 | gain | time greedy / w4 d1 / w8 d2 (ms) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    cases = [(accpar_alexnet(), "a100:128", 512, "volume"), (accpar_vgg11(), "a100:128", 512, "volume")]
    cases += [(load(n), "a100:128", 512, "volume") for n in ("alexnet", "vgg-a", "vgg-e", "resnet-50", "gpt2")]
    cases += [(load(n), "tpu-v3:64,tpu-v2:64", 256, "time") for n in ("alexnet", "vgg-a", "resnet-152", "gpt2")]
    for net, spec, batch, objective in cases:
        devs = parse_array(spec)
        for types in ((0, 1), (0, 1, 2)):
            base = PlanConfig(objective=objective, allowed=types, bytes_per_elem=2.0)
            rows = []
            for extra in ({}, {"search": "lookahead", "width": 4, "depth": 1},
                          {"search": "lookahead", "width": 8, "depth": 2}):
                t0 = time.perf_counter()
                p = plan(net, batch, devs, PlanConfig(**{**base.__dict__, **extra}))
                rows.append((p.objective, time.perf_counter() - t0))
            (g, tg), (l1, t1), (l2, t2) = rows
            unit = (lambda v: f"{v / 1e9:.4f} GB") if objective == "volume" else (lambda v: f"{v * 1e3:.4f} ms")
            print(f"| {net.name} | {spec} | {batch} | {objective} | {len(types)} | {unit(g)} | {unit(l1)} "
                  f"| {(1 - l1 / g) * 100:.2f}% | {unit(l2)} | {(1 - l2 / g) * 100:.2f}% "
                  f"| {tg * 1e3:.0f} / {t1 * 1e3:.0f} / {t2 * 1e3:.0f} |", flush=True)


def tpu() -> None:
    print("\n### TPU-v3 + TPU-v2, time objective, batch 256, 2 bytes/element, Adam state, memory enforced\n")
    print("| array | model | plan step ms | compute / comm ms | ratio | GiB/dev | vs DP | vs one weird trick | vs HyPar |")
    print("|---|---|---|---|---|---|---|---|---|")
    for spec in ("tpu-v3:4,tpu-v2:4", "tpu-v3:64,tpu-v2:64"):
        devs = parse_array(spec)
        for name in ("alexnet", "vgg-16", "vgg-19", "resnet-50", "resnet-152", "gpt2"):
            res = compare_plans(load(name), 256, devs).plans
            p = res["plan"]
            s = {k: (f"{v.step_s / p.step_s:.2f}x" + ("" if v.fits else " (!mem)")) for k, v in res.items()}
            print(f"| {spec} | {name} | {p.step_s * 1e3:.3f} | {p.compute_s * 1e3:.3f} / {p.comm_s * 1e3:.3f} "
                  f"| {p.alpha:.3f} | {p.memory_bytes / 2**30:.2f} | {s['data-parallel']} | {s['one-weird-trick']} "
                  f"| {s['hypar']} |", flush=True)


def memory() -> None:
    print("\n### When memory binds (Adam state at 2 bytes, time objective)\n")
    print("| model | batch | devices | plan ms (memory ignored) | its GiB/dev | plan ms (enforced) | its GiB/dev "
          "| capacity GiB | DP fits | planning s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, batch, spec in (("gpt2-xl", 32, "tpu-v2:8"), ("gpt2-xl", 64, "tpu-v2:8"),
                              ("gpt2-xl", 128, "tpu-v3:4,tpu-v2:4"), ("gpt2-large", 256, "tpu-v2:16"),
                              ("gpt2-xl", 64, "tpu-v2:4")):
        net, devs = load(name), parse_array(spec)
        free = compare_plans(net, batch, devs, fit_memory=False).plans
        t0 = time.perf_counter()
        try:
            held = compare_plans(net, batch, devs).plans
            held_ms, held_gib = f"{held['plan'].step_s * 1e3:.1f}", f"{held['plan'].memory_bytes / 2**30:.2f}"
        except Exception as exc:  # noqa: BLE001 - the one-line error is the result
            held_ms, held_gib = "does not fit", str(exc).split("short by ")[-1].split(";")[0]
        secs = time.perf_counter() - t0
        cap = min(d.memory_bytes for d in devs) / 2**30
        print(f"| {name} | {batch} | {spec} | {free['plan'].step_s * 1e3:.1f} | {free['plan'].memory_bytes / 2**30:.2f} "
              f"| {held_ms} | {held_gib} | {cap:.0f} | {'yes' if free['data-parallel'].fits else 'no'} "
              f"| {secs:.2f} |", flush=True)


def measure(workers: list[int], repeats: int) -> None:
    """`hetrain profile` then `hetrain plan --measure` (subprocesses, as a user runs them)."""
    print("\n### Predicted against measured, local gloo processes, float32 (median of the run's steps)\n")
    print("| model | batch | processes | run | predicted step ms (file) | calibrated step ms | measured step ms "
          "| step error | compute error | level errors | bytes: model / moved |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    cases = [("mlp", 256, None), ("resnet-18", 32, "3,32,32"), ("lenet", 1024, None)]
    with tempfile.TemporaryDirectory() as tmp:
        for w in workers:
            devs = Path(tmp) / f"cpu{w}.yaml"
            subprocess.run([sys.executable, "-m", "hetrain.cli", "profile", "--workers", str(w), "--out", str(devs)],
                           check=True, cwd=ROOT, capture_output=True)
            for name, batch, shape in cases:
                for run in range(repeats):
                    out = Path(tmp) / "m.json"
                    argv = [sys.executable, "-m", "hetrain.cli", "plan", "--model", name, "--batch", str(batch),
                            "--devices", str(devs), "--measure", "--steps", "5", "--json", str(out)]
                    if shape:
                        argv += ["--input-shape", shape]
                    subprocess.run(argv, check=True, cwd=ROOT, capture_output=True, timeout=900)
                    m = json.loads(out.read_text())["measure"]
                    p, c, meas = m["predicted"], m["predicted_calibrated"] or m["predicted"], m["measured"]

                    def err(a, b):
                        return f"{(a - b) / b * 100:+.0f}%" if b > 0 else "-"

                    levels = ", ".join(err(a, b) for a, b in zip(c["level_s"], meas["level_s"]))
                    nbytes = " ; ".join(f"{a / 1e6:.1f} / {b / 1e6:.1f} MB" for a, b in
                                        zip(p["level_bytes"], meas["level_bytes"]))
                    print(f"| {name}{' ' + shape if shape else ''} | {batch} | {w} | {run + 1} | {p['step_s'] * 1e3:.0f} "
                          f"| {c['step_s'] * 1e3:.0f} | {meas['step_s'] * 1e3:.0f} | {err(c['step_s'], meas['step_s'])} "
                          f"| {err(c['compute_s'], meas['compute_s'])} | {levels} | {nbytes} |", flush=True)


TRAIN_CASES = [("cnn", "plan"), ("cnn", "one-weird-trick"), ("mlp", "plan"), ("cnn-residual", "plan"),
               ("cnn-residual", "one-weird-trick")]


def train(repeats: int, devices: str = "tpu-v3:2,tpu-v2:2", steps: int = 300) -> None:
    """`hetrain plan --train` (subprocesses, as a user runs them): each case's JSON record as a table row."""
    print(f"\n### Training with a plan, {devices}, batch 64, {steps} steps (emulated devices)\n")
    print("| workload | scheme | types (g0; g1; g2) | run | accuracy | max loss / gradient diff (float64) "
          "| step ms predicted | measured | error | DDP ms predicted | measured | speedup over DP predicted | measured |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for workload, scheme in TRAIN_CASES:
            for run in range(repeats):
                out = Path(tmp) / "t.json"
                subprocess.run([sys.executable, "-m", "hetrain.cli", "plan", "--train", "--workload", workload,
                                "--scheme", scheme, "--devices", devices, "--steps", str(steps), "--json", str(out)],
                               check=True, cwd=ROOT, capture_output=True, timeout=1800)
                t = json.loads(out.read_text())["train"]
                types = "; ".join(g.split(": ")[1] for g in t["types"])
                print(f"| {workload} | {scheme} | {types} | {run + 1} | {t['final_accuracy']:.4f} "
                      f"| {t['max_loss_diff_vs_unpartitioned']:.1e} / {t['max_grad_diff_vs_unpartitioned']:.1e} "
                      f"| {t['step_s_predicted'] * 1e3:.1f} | {t['step_s_measured'] * 1e3:.1f} "
                      f"| {t['step_error'] * 100:+.0f}% | {t['dp_step_s_predicted'] * 1e3:.1f} "
                      f"| {t['dp_step_s_measured'] * 1e3:.1f} | {t['speedup_over_dp_predicted']:.2f}x "
                      f"| {t['speedup_over_dp_measured']:.2f}x |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("section", choices=("speed", "command", "headline", "hypar", "search", "tpu", "memory",
                                            "measure", "train", "all"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    sections = ["speed", "command", "hypar", "search", "tpu", "memory"] if args.section == "all" else [args.section]
    for s in sections:
        if s == "speed":
            speed(args.repeats)
        elif s == "command":
            command(args.repeats)
        elif s == "headline":
            headline(args.repeats)
        elif s == "measure":
            measure(args.workers, max(1, args.repeats // 2))
        elif s == "train":
            train(args.repeats)
        else:
            globals()[s]()


if __name__ == "__main__":
    main()
