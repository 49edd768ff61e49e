"""The measured profile: what a short real run's metrics record says about the cluster.

Nothing new is instrumented: each worker's compute time per iteration is its ``compute_s`` over its
``iterations``; its variability is ``compute_phase``'s mean over median, and its transient slowdowns
the share and size of its iterations at twice the median or more (:mod:`.variability`); the model's size is the bytes a
worker exchanged per exchange (``uncompressed_bytes / exchanges``, float32; under all-reduce each member
sends 2(n-1)/n of the model, so that is divided out); an all-reduce's cost is what
the slowest worker waited per iteration (it never waits for the others' compute, only for the collective).
"""

from __future__ import annotations

from hetrain.advisor.variability import spikes_of
from hetrain.errors import UsageError
from hetrain.transport.link_spec import ring_allreduce_bytes

PROFILE_VERSION = 2  # 2: each worker's transient slowdowns (``spikes``)


def profile_from_record(record: dict) -> dict:
    """The measured profile of a finished all-reduce run's ``record`` (a ``hetrain train`` metrics.json)."""
    workers = record.get("workers") or []
    if not workers or any(w.get("iterations", 0) < 1 for w in workers):
        idle = [i for i, w in enumerate(workers) if w.get("iterations", 0) < 1]
        raise UsageError(f"the measuring run gave no iteration for worker(s) {idle or 'all'}; give it longer "
                         "(--measure-s) or fewer workers")
    compute_ms = [1000.0 * w["compute_s"] / w["iterations"] for w in workers]
    slowest = max(range(len(workers)), key=lambda i: compute_ms[i])
    slowest_worker = workers[slowest]
    exchanges = max(1, slowest_worker.get("exchanges") or slowest_worker["iterations"])
    message_bytes = (slowest_worker.get("uncompressed_bytes") or 0) / exchanges
    if record.get("protocol") == "allreduce" and len(workers) > 1:  # a ring member's bytes: 2 (n-1)/n model
        message_bytes /= ring_allreduce_bytes(len(workers), 1.0)
    config = record.get("config") or {}
    return {
        "version": PROFILE_VERSION,
        "num_workers": len(workers),
        "compute_ms": [round(c, 3) for c in compute_ms],
        "compute_variability": [_variability(w) for w in workers],
        "spikes": [spikes_of(w) for w in workers],
        "steady_compute_ms": [(w.get("compute_phase") or {}).get("steady_ms_mean") for w in workers],
        "model_params": round(message_bytes / 4) if message_bytes else None,
        "allreduce_ms": round(1000.0 * slowest_worker["wait_s"] / slowest_worker["iterations"], 3),
        "slowest_worker": slowest,
        "link_mbps": config.get("link_mbps"),
        "link_latency_ms": config.get("link_latency_ms"),
        "measured_s": record.get("wall_time_s"),
        "measured_samples_per_s": record.get("samples_per_s"),
        "measured_protocol": record.get("protocol"),
        "batch_size": record.get("batch_size", config.get("batch_size")),
    }


def _variability(worker: dict) -> float | None:
    """Mean over median compute time per iteration, minus 1 (0: steady; 0.5: the mean is 1.5x the median)."""
    phase = worker.get("compute_phase") or {}
    mean, median = phase.get("achieved_ms_mean"), phase.get("achieved_ms_median")
    if not mean or not median:
        return None
    return round(max(0.0, mean / median - 1.0), 4)
