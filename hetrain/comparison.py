"""Run protocols side by side and write the comparison (JSON, a markdown table, a plot)."""

from __future__ import annotations

from pathlib import Path

from hetrain.config import RunConfig
from hetrain.outputs import prepare_out_dir, write_json_atomic, write_text_atomic

TABLE_COLUMNS = (
    ("protocol", "protocol", "{}"),
    ("samples/s", "samples_per_s", "{:.0f}"),
    ("het. efficiency", "heterogeneity_efficiency", "{:.3f}"),
    ("vs allreduce (samples/s)", "speedup_samples_per_s", "{:.2f}x"),
    ("acc. avg model", "final_accuracy_avg_model", "{:.4f}"),
    ("acc. worst worker", "final_accuracy_worst_worker", "{:.4f}"),
    ("time to target (s)", "time_to_target_s", "{:.2f}"),
    ("vs allreduce (time to target)", "speedup_time_to_target", "{:.2f}x"),
    ("consensus dist.", "consensus_distance", "{:.3g}"),
    ("max gap", "max_iteration_gap", "{}"),
    ("stale / dropped", "stale_dropped", "{}"),
)


def run_comparison(configs: list[RunConfig], out_dir: str, progress: bool = True) -> dict:
    """Validate every config first, then run each in turn; return the summary dict."""
    from hetrain.runtime.run import check_run_config, run_training

    for config in configs:
        check_run_config(config)
    out = prepare_out_dir(out_dir)
    runs = []
    for index, config in enumerate(configs):
        label = f"[{index + 1}/{len(configs)}] {config.protocol}"
        runs.append(run_training(config, str(out / config.protocol), progress=progress, label=label))
    summary = summarize(runs)
    write_json_atomic(out / "summary.json", summary)
    write_text_atomic(out / "summary.md", summary["table_markdown"] + "\n")
    plot_accuracy_vs_time(runs, out / "accuracy_vs_time.png", configs[0].target_accuracy)
    return summary


def summarize(runs: list[dict]) -> dict:
    base = next((r for r in runs if r["protocol"] == "allreduce"), None)
    rows = []
    for r in runs:
        row = {k: v for k, v in r.items() if k not in ("workers", "accuracy_curve")}
        row["stale_dropped"] = f"{r.get('updates_stale', 0)} / {r.get('updates_dropped', 0)}"
        row["speedup_samples_per_s"] = r["samples_per_s"] / base["samples_per_s"] if base else None
        row["speedup_time_to_target"] = (
            base["time_to_target_s"] / r["time_to_target_s"]
            if base and base["time_to_target_s"] and r["time_to_target_s"] else None
        )
        rows.append(row)
    return {"runs": rows, "table_markdown": markdown_table(rows)}


def markdown_table(rows: list[dict]) -> str:
    header = "| " + " | ".join(name for name, _, _ in TABLE_COLUMNS) + " |"
    lines = [header, "|" + "---|" * len(TABLE_COLUMNS)]
    for row in rows:
        cells = []
        for _, key, fmt in TABLE_COLUMNS:
            value = row.get(key)
            cells.append("-" if value is None else fmt.format(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_accuracy_vs_time(runs: list[dict], path: Path, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in runs:
        curve = r.get("accuracy_curve") or []
        if curve:
            ax.plot([p["t_s"] for p in curve], [p["accuracy_avg_model"] for p in curve], label=r["protocol"])
    ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:.2f}")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("test accuracy of the averaged model")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    slow = runs[0].get("config", {}).get("slowdown", "")
    ax.set_title(f"{runs[0]['num_workers']} workers, slowdown {slow}")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
