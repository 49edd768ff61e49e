"""The run record (``metrics.json``) and its one-screen summary.

Shared by real runs (``hetrain train``) and simulated ones (``hetrain simulate``),
so the two can be compared field by field.
"""

from __future__ import annotations

import math

SUMMED_COUNTERS = ("updates_stale", "updates_dropped", "skipped_iterations", "groups_formed",
                   "cache_hits", "cache_misses")


def build_metrics(
    *,
    protocol: str,
    workers: list[dict],
    wall_time_s: float,
    batch_size: int,
    standalone_iteration_s: list[float],
    accuracy_curve: list[dict] | None = None,
    target_accuracy: float | None = None,
    final_accuracy_avg_model: float | None = None,
    final_accuracy_worst_worker: float | None = None,
    consensus_distance: float | None = None,
    extra: dict | None = None,
) -> dict:
    """Assemble the record of one run.

    ``workers``: one dict per worker with at least ``iterations`` (gradients it
    computed), ``compute_s`` and ``wait_s``; any other per-worker counters
    (``updates_stale``, ``max_iteration_gap``, ...) are kept and summed/maxed.
    ``standalone_iteration_s[i]``: worker i's own seconds per iteration when it
    never waits (emulated compute time times its slowdown). Heterogeneity
    efficiency = achieved samples/s divided by the sum of standalone speeds.
    """
    total_iterations = sum(w["iterations"] for w in workers)
    samples_per_s = total_iterations * batch_size / wall_time_s if wall_time_s > 0 else 0.0
    ideal = sum(batch_size / t for t in standalone_iteration_s if t > 0)
    time_to_target = None
    if accuracy_curve and target_accuracy is not None:
        for point in accuracy_curve:
            if point.get("accuracy_avg_model") is not None and point["accuracy_avg_model"] >= target_accuracy:
                time_to_target = point["t_s"]
                break
    record = {
        "protocol": protocol,
        "num_workers": len(workers),
        "wall_time_s": wall_time_s,
        "total_iterations": total_iterations,
        "samples_per_s": samples_per_s,
        "ideal_samples_per_s": ideal,
        "heterogeneity_efficiency": samples_per_s / ideal if ideal > 0 else None,
        "final_accuracy_avg_model": final_accuracy_avg_model,
        "final_accuracy_worst_worker": final_accuracy_worst_worker,
        "target_accuracy": target_accuracy,
        "time_to_target_s": time_to_target,
        "consensus_distance": consensus_distance,
        "max_iteration_gap": max((w.get("max_iteration_gap", 0) for w in workers), default=0),
    }
    for key in SUMMED_COUNTERS:
        if key in ("updates_stale", "updates_dropped") or any(key in w for w in workers):
            record[key] = sum(w.get(key, 0) for w in workers)
    if extra:
        record.update(extra)
    record["workers"] = [dict(w, rank=w.get("rank", i)) for i, w in enumerate(workers)]
    record["accuracy_curve"] = accuracy_curve or []
    return record


def _fmt(value, spec: str = ".3f") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return format(value, spec)


def format_summary(m: dict) -> str:
    """A one-screen human summary of a metrics record."""
    lines = [
        f"protocol {m['protocol']}  workers {m['num_workers']}  wall {m['wall_time_s']:.2f} s",
        f"  samples/s {m['samples_per_s']:.1f} of ideal {m['ideal_samples_per_s']:.1f}"
        f"  -> heterogeneity efficiency {_fmt(m['heterogeneity_efficiency'])}",
        f"  accuracy: averaged model {_fmt(m['final_accuracy_avg_model'], '.4f')}"
        f"  worst worker {_fmt(m['final_accuracy_worst_worker'], '.4f')}"
        f"  time to {_fmt(m['target_accuracy'], '.2f')}: {_fmt(m['time_to_target_s'], '.2f')} s",
        f"  consensus distance {_fmt(m['consensus_distance'], '.3g')}  max iteration gap {m['max_iteration_gap']}"
        f"  updates stale {m.get('updates_stale', 0)} dropped {m.get('updates_dropped', 0)}",
        "  worker  iterations  compute_s  wait_s",
    ]
    for w in m["workers"]:
        lines.append(f"  {w['rank']:>6}  {w['iterations']:>10}  {w['compute_s']:>9.2f}  {w['wait_s']:>6.2f}")
    return "\n".join(lines)
