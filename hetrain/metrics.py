"""The run record (``metrics.json``) and its one-screen summary.

Shared by real runs (``hetrain train``) and simulated ones (``hetrain simulate``),
so the two can be compared field by field.
"""

from __future__ import annotations

import math

SUMMED_COUNTERS = ("updates_stale", "updates_dropped", "updates_late", "skipped_iterations", "groups_formed",
                   "cache_hits", "cache_misses")


def build_metrics(
    *,
    protocol: str,
    workers: list[dict],
    wall_time_s: float,
    batch_size: int,
    standalone_iteration_s: list[float],
    alive_fraction: list[float] | None = None,
    accuracy_curve: list[dict] | None = None,
    target_accuracy: float | None = None,
    target_loss: float | None = None,
    final_accuracy_avg_model: float | None = None,
    final_accuracy_worst_worker: float | None = None,
    final_loss_avg_model: float | None = None,
    consensus_distance: float | None = None,
    time_to_target_worst_worker_s: float | None = None,
    efficiency_basis: str | None = None,
    extra: dict | None = None,
) -> dict:
    """Assemble the record of one run.

    ``workers``: one dict per worker with at least ``iterations`` (gradients it
    computed), ``compute_s`` and ``wait_s``; any other per-worker counters
    (``updates_stale``, ``max_iteration_gap``, ...) are kept and summed/maxed.
    ``standalone_iteration_s[i]``: worker i's own seconds per iteration when it
    never waits (emulated compute time times its slowdown). Heterogeneity
    efficiency = achieved samples/s divided by the sum of standalone speeds,
    each weighted by the fraction of the run the worker was alive
    (``alive_fraction``; 1 for survivors). ``efficiency_basis`` says how the
    standalone speeds were obtained (``emulated``, ``in-run``, ``simulated``:
    :mod:`hetrain.jobs.capacity`).
    ``time_to_target_s``: the first curve point whose averaged model reaches
    ``target_loss`` (validation loss at or below it) when given, else
    ``target_accuracy``; ``time_to_target_worst_worker_s``: when every worker's
    own model had (:mod:`hetrain.jobs.evaluation`; None where not measured). Workers that report ``throughput_series`` (windows of
    samples/s and RSS) give the job's series (their sum per window) and the
    rates of the run's first and last quarter.
    """
    total_iterations = sum(w["iterations"] for w in workers)
    samples_per_s = total_iterations * batch_size / wall_time_s if wall_time_s > 0 else 0.0
    alive = alive_fraction or [1.0] * len(standalone_iteration_s)
    ideal = sum(batch_size / t * a for t, a in zip(standalone_iteration_s, alive) if t > 0)
    time_to_target = _time_to_target(accuracy_curve or [], target_accuracy, target_loss)
    series = job_series([w["throughput_series"] for w in workers if w.get("throughput_series")])
    record = {
        "protocol": protocol,
        "num_workers": len(workers),
        "wall_time_s": wall_time_s,
        "total_iterations": total_iterations,
        "samples_per_s": samples_per_s,
        "ideal_samples_per_s": ideal,
        "heterogeneity_efficiency": samples_per_s / ideal if ideal > 0 else None,
        "efficiency_basis": efficiency_basis,
        "final_accuracy_avg_model": final_accuracy_avg_model,
        "final_accuracy_worst_worker": final_accuracy_worst_worker,
        "target_accuracy": target_accuracy,
        "target_loss": target_loss,
        "final_loss_avg_model": final_loss_avg_model,
        "final_train_loss": _final_train_loss(workers),
        "time_to_target_s": time_to_target,
        "time_to_target_worst_worker_s": time_to_target_worst_worker_s,
        "consensus_distance": consensus_distance,
        "max_iteration_gap": max((w.get("max_iteration_gap", 0) for w in workers), default=0),
    }
    for key in SUMMED_COUNTERS:
        if key in ("updates_stale", "updates_dropped") or any(key in w for w in workers):
            record[key] = sum(w.get(key, 0) for w in workers)
    if any("peak_rss_mb" in w for w in workers):
        record["peak_rss_mb_max_worker"] = max(w.get("peak_rss_mb", 0.0) for w in workers)
    for key in ("tcp_connections_training", "tcp_connections_end"):
        counts = [w[key] for w in workers if w.get(key) is not None]
        if counts:
            record[f"{key}_max_worker"] = max(counts)
    if len(series) >= 4:  # a quarter of fewer windows would compare a window with itself
        record["samples_per_s_first_quarter"], record["samples_per_s_last_quarter"] = quarter_rates(series)
        record["rss_mb_all_workers_at_1min"] = rss_at(series, 60.0)
        record["rss_mb_all_workers_at_end"] = series[-1]["rss_mb"]
    record.update(communication(workers, total_iterations * batch_size))
    if extra:
        record.update(extra)
    record["workers"] = [dict(w, rank=w.get("rank", i)) for i, w in enumerate(workers)]
    record["accuracy_curve"] = accuracy_curve or []
    record["throughput_series"] = series
    return record


def communication(workers: list[dict], samples: int) -> dict:
    """The job's traffic from the workers' counters: ``bytes_sent`` (all workers), ``bytes_sent_per_sample``
    (per training sample: the issue of communication efficiency), ``compression_ratio`` (float32 bytes of
    the same messages over bytes sent) and the busiest worker's ``link_s`` (empty when no worker counted)."""
    if not any("bytes_sent" in w for w in workers):
        return {}
    sent = sum(w.get("bytes_sent", 0) for w in workers)
    plain = sum(w.get("uncompressed_bytes", 0) for w in workers)
    compressed = sum(w.get("compressed_bytes", 0) for w in workers)
    return {"bytes_sent": sent, "bytes_received": sum(w.get("bytes_received", 0) for w in workers),
            "bytes_sent_per_sample": sent / samples if samples else None,
            "compression_ratio": plain / compressed if compressed else 1.0,
            "link_s_max_worker": max((w.get("link_s", 0.0) for w in workers), default=0.0)}


def _time_to_target(curve: list[dict], target_accuracy: float | None, target_loss: float | None) -> float | None:
    for point in curve:
        if target_loss is not None:
            if point.get("loss_avg_model") is not None and point["loss_avg_model"] <= target_loss:
                return point["t_s"]
        elif target_accuracy is not None:
            if point.get("accuracy_avg_model") is not None and point["accuracy_avg_model"] >= target_accuracy:
                return point["t_s"]
    return None


def _final_train_loss(workers: list[dict]) -> float | None:
    """Mean over workers of their last window's mean training loss."""
    losses = []
    for w in workers:
        last = [p["train_loss"] for p in w.get("throughput_series") or [] if p.get("train_loss") is not None]
        if last:
            losses.append(last[-1])
    return sum(losses) / len(losses) if losses else None


def job_series(per_worker: list[list[dict]]) -> list[dict]:
    """The job's windows: samples/s and RSS summed over workers, window by window.

    Every worker's windows lie on one grid (``window_s`` from the training clock's zero), the last one
    maybe shorter (it ended there). A job window's rate is the samples every worker processed in it over
    its length, the longest of its workers' windows: a worker that stopped inside it (or before) adds
    the samples it took and no time. Before, rates were summed as they were, and the series stopped at
    the first worker to stop: a fast worker's 1.6 s last window read as if it had lasted the whole 5 s
    (the job's rate 2.6x too high). The job's own last window is left out when it is shorter than a
    whole one (a 10 ms window with one iteration in it would read as a burst).
    """
    if not per_worker or not any(per_worker):
        return []
    nominal = max(s[0].get("window_s", 1.0) for s in per_worker if s)  # (series without lengths: equal ones)
    series = []
    for index in range(max(len(s) for s in per_worker)):
        points = [s[index] for s in per_worker if index < len(s)]
        length = max(p.get("window_s", nominal) for p in points)
        if length <= 0:
            continue
        samples = sum(p["samples_per_s"] * p.get("window_s", nominal) for p in points)
        series.append({
            "t_s": max(p["t_s"] for p in points),
            "samples_per_s": samples / length,
            "rss_mb": round(sum(p["rss_mb"] for p in points), 1),
        })
    last = max(len(s) for s in per_worker) - 1
    if last >= 1 and series and max(s[last].get("window_s", nominal) for s in per_worker if len(s) > last) \
            < 0.99 * nominal:
        series = series[:-1]
    return series


def quarter_rates(series: list[dict]) -> tuple[float | None, float | None]:
    """Mean samples/s over the first and the last quarter of the run's time (windows weighted by overlap)."""
    if not series:
        return None, None
    end = series[-1]["t_s"]

    def mean_rate(lo: float, hi: float) -> float | None:
        samples, start = 0.0, 0.0
        for point in series:
            overlap = max(0.0, min(point["t_s"], hi) - max(start, lo))
            samples += point["samples_per_s"] * overlap
            start = point["t_s"]
        return samples / (hi - lo) if hi > lo else None

    return mean_rate(0.0, end / 4), mean_rate(3 * end / 4, end)


def rss_median(series: list[dict], lo_s: float, hi_s: float) -> float | None:
    """The job's RSS over the windows ending in (lo_s, hi_s]: their median (None if there are none).

    One window's RSS is a single reading, and a worker's buffers come and go within a step (a
    Prague worker of a 100 MB model reads 620 or 840 MB depending on whether a background
    average holds its copies), so a trend (a leak) shows in medians over a minute, not in two readings.
    """
    values = sorted(p["rss_mb"] for p in series if lo_s < p["t_s"] <= hi_s)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def rss_at(series: list[dict], t_s: float) -> float | None:
    """The job's RSS at the first window ending at or after ``t_s`` (None if the run is shorter)."""
    for point in series:
        if point["t_s"] >= t_s:
            return point["rss_mb"]
    return None


def _fmt(value, spec: str = ".3f") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return format(value, spec)


def format_phases(m: dict) -> str:
    """Start-up and ending on one line: where the seconds outside the training loop went."""
    slow = m.get("startup_slowest_worker") or {}
    parts = ", ".join(f"{k[:-2]} {_fmt(slow.get(k), '.2f')}" for k in ("import_s", "setup_s", "connect_s"))
    return (f"start-up {_fmt(m['startup_s'], '.2f')} s to every worker's first iteration "
            f"(launcher {_fmt(m.get('startup_launcher_s'), '.2f')} s; last worker {slow.get('rank', '-')}: "
            f"{parts} s); finish {_fmt(m.get('finish_s_max_worker'), '.2f')} s; "
            f"teardown {_fmt(m.get('teardown_s'), '.2f')} s")


def _members_line(m: dict) -> str | None:
    """Who joined and left a job whose members changed beyond deaths (None for the others)."""
    new = [j for j in m.get("joins") or [] if j.get("new_member")]
    leaves = m.get("leaves") or []
    if not new and not leaves and (m.get("max_workers") or 0) <= m["num_workers"]:
        return None
    first = [j["first_step_s"] for j in new if j.get("first_step_s") is not None]
    steps = f" (first step {min(first):.1f}-{max(first):.1f} s after their start)" if first else ""
    gone = ", ".join(f"{x['rank']} at {x['t_s']:.1f} s" for x in leaves)
    return (f"  members: started {m['num_workers']} (at most {m.get('max_workers') or m['num_workers']}), "
            f"joined {len(new)}{steps}, left {len(leaves)}{f' ({gone})' if gone else ''}; "
            f"{m.get('final_members', '-')} at the end"
            + (f"; {m['joins_not_started']} join(s) never started (no vacant rank, or not due, before the end)"
               if m.get("joins_not_started") else "") + _deal_phrase(m.get("epochs_dealt")))


def _deal_phrase(deal: dict | None) -> str:
    """How the epochs' batches were dealt over the members (hetrain.epoch_deal)."""
    if not deal or not deal["epochs_checked"]:
        return ""
    uneven = [f"{len(deal[k])} {k}" for k in ("short", "over") if deal[k]]
    return (f"; {deal['epochs_checked']} epoch(s) dealt, each its {deal['batches_per_epoch']} batches once"
            if not uneven else f"; {deal['epochs_checked']} epoch(s) dealt, {', '.join(uneven)} "
            "(a dead worker's batches are not in the record)")


def format_summary(m: dict) -> str:
    """A one-screen human summary of a metrics record."""
    lines = [
        f"protocol {m['protocol']}  workers {m['num_workers']}  wall {m['wall_time_s']:.2f} s",
        f"  samples/s {m['samples_per_s']:.1f} of ideal {m['ideal_samples_per_s']:.1f}"
        f"  -> heterogeneity efficiency {_fmt(m['heterogeneity_efficiency'])}"
        + (f" ({m['efficiency_basis']} compute)" if m.get("efficiency_basis") else ""),
        f"  accuracy: averaged model {_fmt(m['final_accuracy_avg_model'], '.4f')}"
        f"  worst worker {_fmt(m['final_accuracy_worst_worker'], '.4f')}",
        ("  time to loss " + _fmt(m.get("target_loss"), ".2f") if m.get("target_loss") is not None
         else "  time to accuracy " + _fmt(m["target_accuracy"], ".2f"))
        + f": averaged model {_fmt(m['time_to_target_s'], '.2f')} s"
        f"  worst worker's own model {_fmt(m.get('time_to_target_worst_worker_s'), '.2f')} s",
        f"  consensus distance {_fmt(m['consensus_distance'], '.3g')}  max iteration gap {m['max_iteration_gap']}"
        f"  updates stale {m.get('updates_stale', 0)}, dropped unused {m.get('updates_dropped', 0)} (a newer one "
        "from the same neighbour came first, or the edge was gone)",
    ]
    if m.get("bytes_sent") is not None:
        comm = (m.get("config") or {})
        link = comm.get("link_mbps") or comm.get("link_latency_ms")
        lines.append(f"  sent {m['bytes_sent'] / 1e6:.1f} MB ({_fmt(m['bytes_sent_per_sample'], '.0f')} bytes/sample)"
                     f"  compression {_fmt(m['compression_ratio'], '.1f')}x"
                     + (f"  link busiest worker {m['link_s_max_worker']:.1f} s" if link else "")
                     + (f"  (H={comm.get('sync_every', 1)}, {comm.get('compression', 'none')}"
                        + (f", link {comm.get('link_mbps') or '-'} Mbit/s {comm.get('link_latency_ms') or 0} ms"
                           if link else "") + ")" if comm else ""))
    if m.get("startup_s") is not None:
        lines.append("  " + format_phases(m))
    if m.get("compute_phase_ratio_min") is not None:
        over = m.get("compute_phase_over_target") or []
        lines.append(f"  compute phase per iteration: lowest worker median {m['compute_phase_ratio_min']:.3f}x its target"
                     + (f"; real compute outlasted the target on worker(s) {', '.join(map(str, over))}" if over
                        else ""))
    if m.get("final_loss_avg_model") is not None:
        lines.append(f"  loss: validation (averaged model) {_fmt(m['final_loss_avg_model'], '.4f')}"
                     f"  training (last window) {_fmt(m.get('final_train_loss'), '.4f')}")
    if m.get("samples_per_s_first_quarter") is not None:
        first, last = m["samples_per_s_first_quarter"], m["samples_per_s_last_quarter"]
        lines.append(f"  samples/s first quarter {_fmt(first, '.1f')}  last quarter {_fmt(last, '.1f')}"
                     f"  ({_fmt(last / first if first else None, '.3f')}x)"
                     f"  RSS all workers at 1 min {_fmt(m['rss_mb_all_workers_at_1min'], '.0f')} MB"
                     f"  at end {_fmt(m['rss_mb_all_workers_at_end'], '.0f')} MB")
    if m.get("interrupted"):
        lines.append(f"  interrupted ({m.get('interrupted_by') or 'Ctrl-C'}): figures cover the run up to the stop")
    if m.get("workers_lost"):
        recoveries = [d.get("recovery_s") for d in m.get("deaths") or m.get("recoveries") or []]
        shown = ", ".join("-" if r is None else f"{r:.2f} s" for r in recoveries)
        goodput = m.get("goodput_samples_per_s")
        joined = [j for j in m.get("joins") or [] if not j.get("new_member")]  # new members: the members line
        joins = (f", replaced {len(joined)} (replacements ready after "
                 + ", ".join(f"{j['join_s']:.1f} s" for j in joined) + ")") if joined else ""
        lines.append(f"  workers lost {m['workers_lost']}{joins}; survivors moved on after {shown}"
                     + (f"; goodput {goodput:.1f} samples/s" if goodput is not None else ""))
    members = _members_line(m)
    if members:
        lines.append(members)
    lines.append("  worker  iterations  compute_s  wait_s  peak_rss_mb")
    for w in m["workers"]:
        note = "  (died)" if "died" in w else "  (left)" if w.get("left") else "  (joined)" if w.get("joined") \
            else "  (replacement)" if w.get("incarnation") else ""
        lines.append(f"  {w['rank']:>6}  {w['iterations']:>10}  {w['compute_s']:>9.2f}  {w['wait_s']:>6.2f}"
                     f"  {_fmt(w.get('peak_rss_mb'), '>11.0f')}{note}")
    return "\n".join(lines)
