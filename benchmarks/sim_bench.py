"""Simulator benchmarks and the fidelity comparison with real runs (measure, don't test).

    python benchmarks/sim_bench.py engine              # bare heap events/s vs SimPy (if installed)
    python benchmarks/sim_bench.py scale               # prague 1,024 x 1,000 timing-only; digits 256 x 200
    python benchmarks/sim_bench.py table [--workers 1000 4000 10000 50000] [--iterations 100]
                                                       # every protocol: wall time, events/s, peak RSS
    python benchmarks/sim_bench.py network [--workers 2 4 8 16]
                                                       # loopback gloo latencies with N processes here
    python benchmarks/sim_bench.py floor [--workers 10000] [--iterations 50]
                                                       # the protocol objects alone (no engine): the
                                                       # least a simulation of Hop/D-PSGD can cost
    python benchmarks/sim_bench.py fidelity [--budget 120] [--workers 4 8 16] [--protocols ...]
                                                       # hetrain train vs hetrain simulate, same settings;
                                                       # the simulator's all-reduce step measured per N

Each prints a markdown table; docs/guides/simulator.md records the figures.
"""

from __future__ import annotations

import argparse
import heapq
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def bench_engine(events: int = 1_000_000) -> None:
    from hetrain.sim.engine import Engine

    heap, t0 = [], time.perf_counter()
    for i in range(events):
        heapq.heappush(heap, (i * 1e-3, i, None, ()))
    while heap:
        heapq.heappop(heap)
    bare = events / (time.perf_counter() - t0)
    engine, count = Engine(), [0]

    def tick(i):
        count[0] += 1
        if i < 100:
            engine.after(1e-3, tick, i + 1)

    for w in range(events // 100):
        engine.at(w * 1e-6, tick, 0)
    t0 = time.perf_counter()
    engine.run()
    ours = engine.events / (time.perf_counter() - t0)
    print(f"| bare heap push+pop | {bare / 1e6:.2f} M events/s |")
    print(f"| hetrain Engine (10,000 chains x 100 callbacks) | {ours / 1e6:.2f} M events/s |")
    try:
        import simpy
    except ImportError:
        print("| SimPy | not installed |")
        return
    env = simpy.Environment()

    def proc(env):
        for _ in range(100):
            yield env.timeout(1e-3)

    for _ in range(events // 100):
        env.process(proc(env))
    t0 = time.perf_counter()
    env.run()
    print(f"| SimPy (10,000 processes x 100 timeouts) | {events / (time.perf_counter() - t0) / 1e6:.2f} M events/s |")


def _measure(argv: list[str]) -> dict:
    """Run ``hetrain simulate`` in a child process; return its record plus runtime and peak RSS."""
    with tempfile.TemporaryDirectory() as out:
        code = ("import resource, sys; from hetrain.cli import main; rc = main(sys.argv[1:]); "
                "print('PEAK_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr); sys.exit(rc)")
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", code, "simulate", *argv, "--out", out, "--no-progress"],
                              cwd=ROOT, capture_output=True, text=True, check=True)
        elapsed = time.perf_counter() - t0
        peak_kb = int(proc.stderr.rsplit("PEAK_KB", 1)[1].split()[0])
        record = json.loads((Path(out) / "metrics.json").read_text())
    record["process_s"], record["peak_mb"] = elapsed, peak_kb / 1024
    return record


def bench_scale() -> None:
    runs = [
        ("prague (smart GG), timing only", ["--protocol", "prague", "--workers", "1024", "--iterations", "1000",
                                            "--slowdown", "every:8:5x"]),
        ("hop double_ring b=1, timing only", ["--protocol", "hop", "--workers", "1024", "--iterations", "1000",
                                   "--slowdown", "every:8:5x", "--backup", "1", "--topology", "double_ring"]),
        ("prague, --math digits", ["--protocol", "prague", "--workers", "256", "--iterations", "200",
                                   "--slowdown", "every:8:5x", "--math", "digits"]),
        ("hop, --math digits", ["--protocol", "hop", "--workers", "256", "--iterations", "200",
                                "--slowdown", "every:8:5x", "--math", "digits"]),
    ]
    print("| run | workers x iterations | process s | events | events/s | peak MB | efficiency | accuracy |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, argv in runs:
        r = _measure(argv)
        acc = "-" if r["final_accuracy_avg_model"] is None else f"{r['final_accuracy_avg_model']:.3f}"
        print(f"| {name} | {r['num_workers']} x {r['iterations_per_worker']} | {r['process_s']:.1f} | "
              f"{r['engine_events']:,} | {r['events_per_s'] / 1e3:.0f}k | {r['peak_mb']:.0f} | "
              f"{r['heterogeneity_efficiency']:.3f} | {acc} |", flush=True)


def bench_table(protocols: list[str], worker_counts: list[int], iterations: int) -> None:
    """Scaling table: timing only, one worker in 8 slowed 5x, each run a fresh process."""
    print(f"timing only, --iterations {iterations}, --slowdown every:8:5x, each protocol's defaults")
    print("| protocol | workers | process s | events | events/s | peak MB | efficiency |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in worker_counts:
        for protocol in protocols:
            r = _measure(["--protocol", protocol, "--workers", str(n), "--iterations", str(iterations),
                          "--slowdown", "every:8:5x", *PROTOCOL_FLAGS[protocol]])
            print(f"| {protocol} | {n:,} | {r['process_s']:.1f} | {r['engine_events']:,} | "
                  f"{r['events_per_s'] / 1e3:.0f}k | {r['peak_mb']:.0f} | {r['heterogeneity_efficiency']:.3f} |",
                  flush=True)


PROTOCOL_FLAGS = {
    "allreduce": [], "dpsgd": [], "hop": [],  # Hop's defaults on a ring, as in train
    "prague": ["--gg", "smart"], "adpsgd": [], "ps": [],
}


def bench_floor(worker_counts: list[int], iterations: int) -> None:
    """The runtime's HopWorker calls alone, every worker in lock step on a ring: no events, no clock,
    no network model, no skips. Each worker-iteration makes the calls a simulation must make (start,
    one receive per in-neighbour, the ready check, complete, one token return per in-neighbour), so
    this is a lower bound on what simulating these protocols with these objects costs."""
    from hetrain.protocols.hop_config import HopConfig, HopOptions
    from hetrain.protocols.hop_logic import HopWorker
    from hetrain.topology import make_topology

    print("| protocol | workers | iterations | logic CPU s | us per worker-iteration | 10,000 x 1,000 at this rate |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for n in worker_counts:
        topology = make_topology("ring", n)
        for name, config in (("hop", HopOptions().config_for(topology)), ("dpsgd", HopConfig())):
            workers = [HopWorker.for_rank(topology, rank, config) for rank in range(n)]
            t0 = time.process_time()
            for _ in range(iterations):
                for w in workers:
                    if w.plan_skip() is None and w.can_start():
                        w.start()
                for w in workers:
                    for m in w.out_neighbors:
                        workers[m].receive_update(w.rank, w.iteration, None)
                for w in workers:
                    assert w.ready_to_average()
                    for j in w.complete().tokens_to:
                        workers[j].receive_tokens(w.rank, 1)
            cpu = time.process_time() - t0
            per = cpu / (n * iterations)
            print(f"| {name} | {n:,} | {iterations} | {cpu:.2f} | {per * 1e6:.1f} | {per * 1e7:.0f} s |", flush=True)


def _gloo(n: int) -> dict:
    from gloo_latency import measure

    from hetrain.sim.math_model import DIGITS_PARAMS
    from hetrain.sim.network import NetworkParams

    return measure(n, DIGITS_PARAMS * 4, NetworkParams().bytes_per_s)


def bench_network(worker_counts: list[int]) -> None:
    print("loopback gloo, the digits MLP's gradient (float32) for the all-reduce; medians")
    print("| processes | one-way 8 B (us) | all-reduce (ms) | ring step (us): --collective-step-us |")
    print("| ---: | ---: | ---: | ---: |")
    for n in worker_counts:
        r = _gloo(n)
        one_way = "-" if r["one_way_us"] is None else f"{r['one_way_us']:.0f}"
        print(f"| {n} | {one_way} | {r['allreduce_ms']:.2f} | {r['step_us']:.0f} |", flush=True)


def bench_fidelity(protocols: list[str], worker_counts: list[int], budget_s: float, compute_ms: float,
                   calibrate: bool = True) -> None:
    print(f"compute {compute_ms:g} ms, worker 0 slowed 5x, --time-budget {budget_s:g} s; "
          "efficiency = heterogeneity efficiency")
    steps = {}
    for n in worker_counts if calibrate else []:
        steps[n] = _gloo(n)["step_us"]
        print(f"all-reduce ring step with {n} processes here: {steps[n]:.0f} us (--collective-step-us)")
    print("| protocol | workers | train samples/s | sim samples/s | ratio | train eff. | sim eff. |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for protocol in protocols:
        for n in worker_counts:
            common = ["--protocol", protocol, "--workers", str(n), "--compute-ms", str(compute_ms),
                      "--slowdown", "0:5x", "--time-budget", str(budget_s), *PROTOCOL_FLAGS[protocol]]
            step = ["--collective-step-us", f"{steps[n]:.1f}"] if n in steps else []
            with tempfile.TemporaryDirectory() as out:
                subprocess.run([sys.executable, "-m", "hetrain", "train", *common, "--out", out, "--no-progress"],
                               cwd=ROOT, capture_output=True, text=True, check=True, timeout=600)
                real = json.loads((Path(out) / "metrics.json").read_text())
            sim = _measure(common + step)
            ratio = sim["samples_per_s"] / real["samples_per_s"]
            print(f"| {protocol} | {n} | {real['samples_per_s']:.0f} | {sim['samples_per_s']:.0f} | {ratio:.2f} | "
                  f"{real['heterogeneity_efficiency']:.3f} | {sim['heterogeneity_efficiency']:.3f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("engine", "scale", "table", "network", "floor", "fidelity"))
    parser.add_argument("--protocols", nargs="+", default=list(PROTOCOL_FLAGS))
    parser.add_argument("--workers", nargs="+", type=int, default=None,
                        help="fidelity: default 4 8 16; network: 2 4 8 16; table: 1000 4000 10000 50000; floor: 10000")
    parser.add_argument("--no-calibrate", action="store_true",
                        help="fidelity: simulate the all-reduce with the default step (the message latency)")
    parser.add_argument("--iterations", type=int, default=None, help="table: iterations per worker (default 100); floor: 50")
    parser.add_argument("--budget", type=float, default=120.0, help="fidelity: seconds per real and simulated run")
    parser.add_argument("--compute-ms", type=float, default=50.0)
    args = parser.parse_args()
    if args.what == "engine":
        bench_engine()
    elif args.what == "scale":
        bench_scale()
    elif args.what == "table":
        bench_table(args.protocols, args.workers or [1000, 4000, 10000, 50000], args.iterations or 100)
    elif args.what == "floor":
        bench_floor(args.workers or [10000], args.iterations or 50)
    elif args.what == "network":
        bench_network(args.workers or [2, 4, 8, 16])
    else:
        bench_fidelity(args.protocols, args.workers or [4, 8, 16], args.budget, args.compute_ms,
                       calibrate=not args.no_calibrate)
    print(f"(this process peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB)")


if __name__ == "__main__":
    main()
