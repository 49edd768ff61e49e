"""Elastic membership (issue 71): a job that grows, a worker that leaves, and minutes of churn.

    .venv/bin/python benchmarks/elastic_bench.py --out runs/elastic                      # every part, hop and prague
    .venv/bin/python benchmarks/elastic_bench.py --out runs/elastic --parts grow --budget 20   # a quick look

Parts (each run on the digits MLP, ``--compute-ms 50``, worker 0 3x slower, in this process's launcher):

- ``grow``: a job started with 2 workers that grows to 6 (``--join 4@8s``) beside one started with 6, for
  ``--budget`` seconds each. Goals: exit 0, 6 members at the end holding one model, the last quarter's
  samples/s >= 0.9x the 6-worker job's, final accuracy (averaged model) within 0.01 of it; each joining
  worker's first step <= 3 s after its process started; each epoch's batches dealt once over the members
  (``epochs_dealt``: none short, none over).
- ``leave``: SIGTERM (from outside, to the worker's pid) to worker 3 of a 6-worker Hop job under
  ``--on-failure abort``, 10 s into training. Goals: exit 0, ``leaves`` names 3, ``deaths`` empty, the others
  end with one model.
- ``soak``: ``--soak-s`` seconds (default 300) of a job started with 4 workers that may grow to
  ``--soak-max`` (default 5: room for one more, so each join takes the rank the last leaver left): a join or
  a leave every 30 s (joins at 30, 90, 150, 210 s; SIGTERM to the highest live rank at 60, 120, 180, 240 s).
  Goals: exit 0, no hang, each worker's RSS (median of its readings over its last 30 s) within 5% of the
  same over its second 30 s of life (a worker's share does not grow); each epoch dealt once, as in ``grow``.

Writes OUT/elastic.json and OUT/elastic.md after every run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from hetrain.config import RunConfig
from hetrain.errors import HetrainError
from hetrain.jobs.local_job import run_local
from hetrain.jobs.run import run_training
from hetrain.metrics import job_series, quarter_rates

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from process_tree import comm, descendants  # noqa: E402  (the tests' own /proc reader)

BASE = dict(workload="mlp", compute_ms=50.0, slowdown="0:3x", timeout_s=30.0)
RATE_GOAL, ACCURACY_GOAL, FIRST_STEP_GOAL_S, RSS_GROWTH_GOAL = 0.9, 0.01, 3.0, 0.05


def _series(metrics: dict) -> list[dict]:
    return job_series([w.get("throughput_series", []) for w in metrics["workers"]])


def _one_model(metrics: dict, ranks=None) -> bool:
    prints = {tuple(round(v, 6) for v in w["model_fingerprint"]) for w in metrics["workers"]
              if (ranks is None or w["rank"] in ranks) and not w.get("left") and "died" not in w}
    return len(prints) == 1


class Churn:
    """An on_message spy that sends SIGTERM to a worker at given training times (the highest live rank, or
    the one named), found by its process name among this process's descendants."""

    def __init__(self, at_s: list[float], rank: int | None = None):
        self.at_s, self.rank = sorted(at_s), rank
        self.sent: list[tuple[float, int]] = []
        self.live: dict[int, float] = {}

    def __call__(self, reporter: int, message) -> None:
        if not isinstance(message, dict) or "t_s" not in message:
            return
        self.live[reporter] = message["t_s"]
        if message.get("done"):
            self.live.pop(reporter, None)
        if not self.at_s or message["t_s"] < self.at_s[0]:
            return
        targets = [self.rank] if self.rank is not None else sorted(self.live, reverse=True)
        for rank in targets:
            pids = [p for p in descendants(os.getpid()) if comm(p).split(".")[0] == f"hetrain-w{rank}"]
            if pids and rank != 0:
                os.kill(pids[0], signal.SIGTERM)
                self.sent.append((message["t_s"], rank))
                self.live.pop(rank, None)
                self.at_s.pop(0)
                return

    def launch(self, *args, **kwargs):
        own = kwargs["on_message"]

        def both(rank, message):
            self(rank, message)
            own(rank, message)
        return run_local(*args, **{**kwargs, "on_message": both})


RECORDS: list[Path] = []  # where each run's metrics.json goes (set by main: OUT/runs/<name>)


def _run(config: RunConfig, churn: Churn | None = None, name: str = "run") -> tuple[dict | None, str | None, float]:
    began = time.monotonic()
    out = RECORDS[0] / name if RECORDS else None
    try:
        metrics = run_training(config, str(out) if out else None, progress=False,
                               launch=churn.launch if churn else None)
        return metrics, None, time.monotonic() - began
    except HetrainError as error:
        return None, str(error), time.monotonic() - began


def _dealt(metrics: dict) -> dict | None:
    """The run's check of each epoch's deal over the members (hetrain.epoch_deal), without the first epoch's number."""
    deal = metrics.get("epochs_dealt")
    return {k: deal[k] for k in ("epochs_checked", "short", "over")} if deal else None


def _dealt_whole(row: dict) -> bool:
    deal = row.get("epochs_dealt")
    return bool(deal and deal["epochs_checked"] and not deal["short"] and not deal["over"])


def grow(protocol: str, budget_s: float, pair: int = 0) -> dict:
    grown, error_g, _ = _run(RunConfig(protocol=protocol, num_workers=2, max_workers=6, join="4@8s",
                                       time_budget_s=budget_s, **BASE), name=f"grow-{protocol}-grown-{pair}")
    fixed, error_f, _ = _run(RunConfig(protocol=protocol, num_workers=6, time_budget_s=budget_s, **BASE),
                             name=f"grow-{protocol}-fixed-{pair}")
    row = {"part": "grow", "protocol": protocol, "pair": pair, "budget_s": budget_s, "error": error_g or error_f}
    if grown is None or fixed is None:
        return row
    last_g, last_f = quarter_rates(_series(grown))[1], quarter_rates(_series(fixed))[1]
    first_steps = [j.get("first_step_s") for j in grown["joins"] if j.get("new_member")]
    row.update(final_members=grown["final_members"], one_model=_one_model(grown),
               last_quarter_grown=last_g, last_quarter_fixed=last_f,
               rate_ratio=last_g / last_f if last_g and last_f else None,
               accuracy_grown=grown["final_accuracy_avg_model"], accuracy_fixed=fixed["final_accuracy_avg_model"],
               first_step_s=first_steps, joined_wall_s=[j.get("wall_s") for j in grown["joins"]],
               epochs_dealt=_dealt(grown))
    row["meets_goals"] = (row["final_members"] == 6 and row["one_model"] and row["rate_ratio"] is not None
                          and _dealt_whole(row)
                          and row["rate_ratio"] >= RATE_GOAL
                          and abs(row["accuracy_grown"] - row["accuracy_fixed"]) <= ACCURACY_GOAL
                          and all(s is not None and s <= FIRST_STEP_GOAL_S for s in first_steps))
    return row


def leave(budget_s: float) -> dict:
    churn = Churn([10.0], rank=3)
    metrics, error, _ = _run(RunConfig(protocol="hop", num_workers=6, on_failure="abort", time_budget_s=budget_s,
                                       **BASE), churn, name="leave-hop")
    row = {"part": "leave", "protocol": "hop", "budget_s": budget_s, "error": error, "sigterm": churn.sent}
    if metrics is None:
        return row
    row.update(leaves=[x["rank"] for x in metrics["leaves"]], leave_t_s=[x["t_s"] for x in metrics["leaves"]],
               deaths=len(metrics["deaths"]), final_members=metrics["final_members"],
               one_model=_one_model(metrics))
    row["meets_goals"] = row["leaves"] == [3] and row["deaths"] == 0 and row["one_model"]
    return row


def _rss_growth(worker: dict) -> float | None:
    """A worker's RSS over its last 30 s against its second 30 s of life (medians of its readings)."""
    series = worker.get("throughput_series", [])
    trained = [p["t_s"] - p["window_s"] for p in series if p["samples_per_s"] > 0]
    if not trained:
        return None
    start, end = trained[0], series[-1]["t_s"]  # a joiner's windows from 0 to its start are empty

    def median(lo, hi):
        values = sorted(p["rss_mb"] for p in series if lo < p["t_s"] <= hi)
        return values[len(values) // 2] if values else None
    early, late = median(start + 30.0, start + 60.0), median(end - 30.0, end)
    return (late - early) / early if early and late and end - start >= 90.0 else None


def soak(protocol: str, soak_s: float, max_workers: int = 5) -> dict:
    joins = ",".join(f"1@{t:g}s" for t in (30, 90, 150, 210) if t < soak_s)
    churn = Churn([t for t in (60.0, 120.0, 180.0, 240.0) if t < soak_s])
    config = RunConfig(protocol=protocol, num_workers=4, max_workers=max_workers, join=joins, time_budget_s=soak_s,
                       **BASE)
    metrics, error, wall_s = _run(config, churn, name=f"soak-{protocol}")
    row = {"part": "soak", "protocol": protocol, "budget_s": soak_s, "error": error, "wall_s": round(wall_s, 1),
           "sigterm": churn.sent}
    if metrics is None:
        return row
    growth = {f"{w['rank']}.{w.get('incarnation', 0)}": _rss_growth(w) for w in metrics["workers"]}
    measured = [g for g in growth.values() if g is not None]
    row.update(max_workers=max_workers, joined_ranks=[f"{j['rank']}.{j['incarnation']}" for j in metrics["joins"]],
               joins_not_started=metrics.get("joins_not_started"),
               joins=len([j for j in metrics["joins"] if j.get("new_member")]), leaves=len(metrics["leaves"]),
               deaths=len(metrics["deaths"]), final_members=metrics["final_members"], one_model=_one_model(metrics),
               rss_growth_by_worker=growth, rss_growth_max=max(measured) if measured else None,
               samples_per_s=metrics["samples_per_s"], epochs_dealt=_dealt(metrics))
    row["meets_goals"] = (row["deaths"] == 0 and row["one_model"] and row["rss_growth_max"] is not None
                          and _dealt_whole(row) and not row["joins_not_started"]
                          and row["rss_growth_max"] <= RSS_GROWTH_GOAL)
    return row


def _write(out: Path, rows: list[dict]) -> None:
    (out / "elastic.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = ["| part | protocol | goals met | figures |", "| --- | --- | --- | --- |"]
    for row in rows:
        shown = {k: v for k, v in row.items() if k not in ("part", "protocol", "meets_goals")}
        lines.append(f"| {row['part']} | {row['protocol']} | {row.get('meets_goals')} | "
                     f"{json.dumps(shown, default=str)} |")
    (out / "elastic.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--parts", default="grow,leave,soak")
    parser.add_argument("--protocols", default="hop,prague")
    parser.add_argument("--budget", type=float, default=40.0, help="seconds of training of each grow run")
    parser.add_argument("--soak-s", type=float, default=300.0)
    parser.add_argument("--soak-max", type=int, default=5, help="soak: the job's largest size (4 start)")
    parser.add_argument("--pairs", type=int, default=1, help="grow: grown and fixed runs in turn, this many pairs")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    RECORDS.append(out / "runs")
    parts, protocols = args.parts.split(","), args.protocols.split(",")
    rows: list[dict] = []
    for part in parts:
        for protocol in (protocols if part != "leave" else ["hop"]):
            for pair in range(args.pairs if part == "grow" else 1):
                print(f"{part} {protocol} ...", file=sys.stderr, flush=True)
                row = grow(protocol, args.budget, pair) if part == "grow" else leave(30.0) if part == "leave" \
                    else soak(protocol, args.soak_s, args.soak_max)
                rows.append(row)
                _write(out, rows)
                print(json.dumps(row, default=str), flush=True)
    return 0 if all(r.get("meets_goals") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
