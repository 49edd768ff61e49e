"""Issue 72's benchmark: does `hetrain advise` pick a configuration as good as trying them all, at a fraction of the cost?

    .venv/bin/python benchmarks/advise_bench.py [--clusters one-slow,random,one-slow-1mbps] [--budget 60]
                                                [--workers 8] [--compute-ms 50] [--measure-s 5] [--out DIR]

For each emulated cluster (8 workers, 50 ms of compute per iteration):

* ``one-slow``: worker 0 five times slower (``--slowdown 0:5x``);
* ``random``: random transient stragglers (``--slowdown random:p=0.1,factor=6``);
* ``one-slow-1mbps``: worker 0 five times slower, every worker's link 1 Mbit/s (``--link-mbps 1``);

it runs ``hetrain advise`` (timed), the ``hetrain train`` command it recommends, and ``hetrain compare
--protocols allreduce,dpsgd,hop,prague`` (``--budget`` s each, timed), every one as a subprocess, one
after another. It reports the goals (the recommended run reaches the target no later than 1.15x the best
compare run; advise takes <= 0.2x the compare's wall time; predicted samples/s within 15% of measured for
the recommended configuration) and, for every candidate that ran for real (the recommended one and those
equal to a compare run's protocol defaults), the measured samples/s and time to target beside the
predicted. Writes OUT/advise_bench.json and OUT/advise_bench.md and prints the tables; the results go
into docs/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hetrain.config import RunConfig  # noqa: E402

CLUSTERS = {
    "one-slow": ["--slowdown", "0:5x"],
    "random": ["--slowdown", "random:p=0.1,factor=6"],
    "one-slow-1mbps": ["--slowdown", "0:5x", "--link-mbps", "1"],
}
COMPARED = ("allreduce", "dpsgd", "hop", "prague")
TIME_GOAL = 1.15  # the recommended run's time to target over the best compare run's, at most
COST_GOAL = 0.2  # advise's wall time over the compare's, at most
RATE_GOAL = 0.15  # |predicted / measured - 1| for the recommended configuration, at most


def _hetrain(args: list[str], log: Path, timeout_s: float) -> float:
    """Run ``python -m hetrain ARGS`` to completion (output to ``log``); its wall time in seconds."""
    began = time.perf_counter()
    with open(log, "w") as handle:
        done = subprocess.run([sys.executable, "-m", "hetrain", *args], stdout=handle, stderr=subprocess.STDOUT,
                              cwd=ROOT, timeout=timeout_s)
    if done.returncode != 0:
        raise SystemExit(f"hetrain {' '.join(args[:1])} failed (exit {done.returncode}); see {log}")
    return time.perf_counter() - began


def _load_average() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def _same_as_default(candidate: dict, protocol: str, workers: int) -> bool:
    """Whether ``candidate`` is what ``hetrain compare`` runs for ``protocol``: its defaults, no comm change."""
    if candidate["protocol"] != protocol or candidate["comm"]:
        return False
    given = RunConfig(protocol=protocol, num_workers=workers, options=dict(candidate["options"])).protocol_options()
    default = RunConfig(protocol=protocol, num_workers=workers).protocol_options()
    if hasattr(given, "resolve"):  # hop: compare the settings with its defaults filled in (backup 1 on a ring)
        return _resolved(given, workers) == _resolved(default, workers)
    return given == default


def _resolved(options, workers: int):
    topology, config = options.resolve(workers)
    return topology.name, config


def _measured(metrics: dict) -> dict:
    return {"samples_per_s": metrics["samples_per_s"], "time_to_target_s": metrics.get("time_to_target_s"),
            "heterogeneity_efficiency": metrics.get("heterogeneity_efficiency"),
            "final_accuracy_avg_model": metrics.get("final_accuracy_avg_model")}


def run_cluster(name: str, args, out: Path) -> dict:
    """advise, the recommended command, and compare on one cluster; every figure the goals need."""
    where = out / name
    where.mkdir(parents=True, exist_ok=True)
    common = ["--workers", str(args.workers), "--compute-ms", f"{args.compute_ms:g}", "--time-budget",
              f"{args.budget:g}", *CLUSTERS[name]]
    load_before = _load_average()
    print(f"[{name}] advise (load {load_before})", file=sys.stderr, flush=True)
    advice_path = where / "advice.json"
    advise_s = _hetrain(["advise", *common, "--measure-s", f"{args.measure_s:g}", "--json", str(advice_path)],
                        where / "advise.log", 600)
    advice = json.loads(advice_path.read_text())
    words = shlex.split(advice["recommended"]["command"])
    words[words.index("--out") + 1] = str(where / "advised")
    print(f"[{name}] recommended: {shlex.join(words)}", file=sys.stderr, flush=True)
    advised_s = _hetrain([*words[1:], "--no-progress"], where / "advised.log", args.budget + 300)
    advised = json.loads((where / "advised" / "metrics.json").read_text())
    print(f"[{name}] compare (load {_load_average()})", file=sys.stderr, flush=True)
    compare_s = _hetrain(["compare", "--protocols", ",".join(COMPARED), *common, "--out", str(where / "compare"),
                          "--no-progress"], where / "compare.log", 4 * (args.budget + 300))
    compared = {p: json.loads((where / "compare" / p / "metrics.json").read_text()) for p in COMPARED}
    times = {p: m.get("time_to_target_s") for p, m in compared.items()}
    reached = [t for t in times.values() if t is not None]
    best_time = min(reached) if reached else None
    recommended = advice["candidates"][0]
    checked = [{"name": recommended["name"], "recommended": True, "predicted": _predicted(recommended),
                "measured": _measured(advised)}]
    for candidate in advice["candidates"][1:]:
        for protocol in COMPARED:
            if _same_as_default(candidate, protocol, args.workers):
                checked.append({"name": candidate["name"], "recommended": False, "predicted": _predicted(candidate),
                                "measured": _measured(compared[protocol]), "measured_by": f"compare {protocol}"})
    rate_error = recommended["samples_per_s"] / advised["samples_per_s"] - 1.0
    advised_time = advised.get("time_to_target_s")
    return {
        "cluster": name, "flags": common, "load_average_before": load_before, "load_average_after": _load_average(),
        "advise_wall_s": round(advise_s, 2), "advise_measure_wall_s": advice.get("measure_wall_s"),
        "advise_simulate_s": advice.get("simulate_s"), "compare_wall_s": round(compare_s, 2),
        "advised_wall_s": round(advised_s, 2), "recommended_command": advice["recommended"]["command"],
        "why": advice["why"], "profile": advice["profile"],
        "compare_time_to_target_s": times, "best_compare_time_to_target_s": best_time,
        "advised_time_to_target_s": advised_time, "checked": checked,
        "goals": {
            "time_to_target_ratio": (advised_time / best_time) if advised_time and best_time else None,
            "time_to_target_ok": bool(advised_time and best_time and advised_time <= TIME_GOAL * best_time),
            "cost_ratio": advise_s / compare_s,
            "cost_ok": advise_s <= COST_GOAL * compare_s,
            "rate_error": rate_error,
            "rate_ok": abs(rate_error) <= RATE_GOAL,
        },
    }


def _predicted(candidate: dict) -> dict:
    return {k: candidate.get(k) for k in ("samples_per_s", "time_to_target_s", "heterogeneity_efficiency")}


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def tables(results: list[dict]) -> str:
    lines = ["| cluster | advise (s) | compare (s) | advise / compare | recommended | its time to target (s) | "
             "best compare time to target (s) | ratio | predicted / measured samples/s | goals met |",
             "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        g = r["goals"]
        rec = r["checked"][0]
        best = min((p for p, t in r["compare_time_to_target_s"].items() if t is not None),
                   key=lambda p: r["compare_time_to_target_s"][p], default=None)
        met = ", ".join(k for k in ("time_to_target", "cost", "rate") if g[f"{k}_ok"]) or "none"
        lines.append(f"| {r['cluster']} | {r['advise_wall_s']:.1f} | {r['compare_wall_s']:.1f} | "
                     f"{g['cost_ratio']:.3f} | {rec['name']} | {_fmt(r['advised_time_to_target_s'], '.2f')} | "
                     f"{_fmt(r['best_compare_time_to_target_s'], '.2f')} ({best or '-'}) | "
                     f"{_fmt(g['time_to_target_ratio'], '.2f')} | {1 + g['rate_error']:.3f} | {met} |")
    lines += ["", "| cluster | configuration | measured by | predicted samples/s | measured samples/s | "
              "measured / predicted | predicted time to target (s) | measured time to target (s) |",
              "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        for c in r["checked"]:
            p, m = c["predicted"], c["measured"]
            lines.append(f"| {r['cluster']} | {c['name']}{' (recommended)' if c['recommended'] else ''} | "
                         f"{c.get('measured_by', 'the recommended command')} | {p['samples_per_s']:.0f} | "
                         f"{m['samples_per_s']:.0f} | {m['samples_per_s'] / p['samples_per_s']:.3f} | "
                         f"{_fmt(p['time_to_target_s'], '.2f')} | {_fmt(m['time_to_target_s'], '.2f')} |")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", default=",".join(CLUSTERS), help=f"comma list from {', '.join(CLUSTERS)}")
    parser.add_argument("--budget", type=float, default=60.0, help="time budget of every training run (s)")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--compute-ms", type=float, default=50.0, dest="compute_ms")
    parser.add_argument("--measure-s", type=float, default=5.0, dest="measure_s", help="advise's measuring run (s)")
    parser.add_argument("--out", default=None, help="where the runs go (default: a temp dir)")
    args = parser.parse_args(argv)
    names = [c.strip() for c in args.clusters.split(",") if c.strip()]
    unknown = [c for c in names if c not in CLUSTERS]
    if unknown:
        parser.error(f"unknown cluster {unknown[0]!r}; choose from {', '.join(CLUSTERS)}")
    out = Path(args.out or tempfile.mkdtemp(prefix="advise_bench_"))
    out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    results = [{**run_cluster(name, args, out), "commit": commit.strip() or None} for name in names]
    table = tables(results)
    (out / "advise_bench.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "advise_bench.md").write_text(table + "\n")
    print(table)
    print(f"\nruns in {out}", file=sys.stderr)
    return results


if __name__ == "__main__":
    main()
