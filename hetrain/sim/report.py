"""Writing a simulated run: metrics.json (as ``hetrain train``), optional timelines, a short summary."""

from __future__ import annotations

from pathlib import Path

from hetrain.metrics import format_summary
from hetrain.outputs import write_json_atomic, write_text_atomic

MAX_SUMMARY_WORKERS = 16


def summary(record: dict) -> str:
    """format_summary, with the per-worker lines cut to the first and last few at scale."""
    workers = record["workers"]
    if len(workers) <= MAX_SUMMARY_WORKERS:
        text = format_summary(record)
    else:
        head = dict(record, workers=workers[:8] + workers[-4:])
        lines = format_summary(head).splitlines()
        lines.insert(len(lines) - 4, f"  ... {len(workers) - 12} more workers in metrics.json")
        text = "\n".join(lines)
    return (f"{text}\n  simulated: {record['engine_events']} events in {record['sim_runtime_s']:.2f} s "
            f"({(record['events_per_s'] or 0) / 1e3:.0f}k events/s)")


def write_run(out: Path, record: dict) -> list[Path]:
    """Write OUT/metrics.json (and OUT/timelines.json when the record carries timelines)."""
    written = []
    timeline = record.pop("timeline", None)
    record.pop("trace", None)
    if timeline is not None:
        data = {"unit": "seconds", "fields": ["start_s", "end_s", "iteration"],
                "workers": [[list(seg) for seg in segs] for segs in timeline]}
        write_json_atomic(out / "timelines.json", data)
        written.append(out / "timelines.json")
    write_json_atomic(out / "metrics.json", record)
    write_text_atomic(out / "summary.txt", summary(record) + "\n")
    written[:0] = [out / "metrics.json", out / "summary.txt"]
    return written
