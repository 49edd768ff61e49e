"""Run protocols side by side and write the comparison (JSON, a markdown table, a plot).

The plot, ``over_time.png``, has panels side by side, one line per protocol, against
wall time: the averaged model's test accuracy and its test loss (for ``lm``: its
validation loss, one panel), and the job's throughput (samples/s per 5 s window).
The loss panel shows what accuracy hides on a long run: a model whose loss climbs
while its accuracy holds is drifting (docs/decisions/hop-uses-late-updates.md);
the table says the same in two columns, the averaged model's loss at a quarter of
the run and its loss at the end over that one (above 1: worse the longer it trains).
A Ctrl-C or SIGTERM during one protocol ends the comparison after that protocol's record; one in a
protocol's start-up ends it with the runs before that one summarized.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from hetrain.config import RunConfig
from hetrain.outputs import check_out_dir, prepare_out_dir, write_json_atomic, write_text_atomic

TABLE_COLUMNS = (
    ("protocol", "protocol", "{}"),
    ("samples/s", "samples_per_s", "{:.0f}"),
    ("het. efficiency", "heterogeneity_efficiency", "{:.3f}"),
    ("vs allreduce (samples/s)", "speedup_samples_per_s", "{:.2f}x"),
    ("acc. avg model", "final_accuracy_avg_model", "{:.4f}"),
    ("acc. worst worker", "final_accuracy_worst_worker", "{:.4f}"),
    ("loss avg model", "final_loss_avg_model", "{:.3f}"),
    ("loss avg model at 1/4 run", "loss_avg_model_quarter", "{:.3f}"),
    ("loss end / at 1/4", "loss_drift", "{:.3f}"),
    ("time to target, avg model (s)", "time_to_target_s", "{:.2f}"),
    ("vs allreduce (avg model)", "speedup_time_to_target", "{:.2f}x"),
    ("time to target, worst worker (s)", "time_to_target_worst_worker_s", "{:.2f}"),
    ("vs allreduce (worst worker)", "speedup_time_to_target_worst_worker", "{:.2f}x"),
    ("consensus dist.", "consensus_distance", "{:.3g}"),
    ("max gap", "max_iteration_gap", "{}"),
    ("stale / dropped", "stale_dropped", "{}"),
    ("last/first quarter samples/s", "rate_drift", "{:.3f}"),
    ("peak RSS/worker MB", "peak_rss_mb_max_worker", "{:.0f}"),
    ("bytes sent/sample", "bytes_sent_per_sample", "{:.0f}"),
)
# what `hetrain compare` prints: the columns a person compares first, within CONSOLE_WIDTH (the whole
# table goes to summary.md and summary.json)
CONSOLE_COLUMNS = (
    ("protocol", "protocol", "{}"),
    ("samples/s", "samples_per_s", "{:.0f}"),
    ("efficiency", "heterogeneity_efficiency", "{:.3f}"),
    ("vs allreduce", "speedup_samples_per_s", "{:.2f}x"),
    ("acc. avg", "final_accuracy_avg_model", "{:.4f}"),
    ("acc. worst", "final_accuracy_worst_worker", "{:.4f}"),
    ("to target avg (s)", "time_to_target_s", "{:.2f}"),
    ("to target worst (s)", "time_to_target_worst_worker_s", "{:.2f}"),
)
CONSOLE_WIDTH = 120


def run_comparison(configs: list[RunConfig], out_dir: str, progress: bool = True) -> dict:
    """Validate every config first, then run each in turn; return the summary dict."""
    from hetrain.jobs.warm_start import start_early
    from hetrain.run_checks import check_before_start

    for config in configs:  # what needs no torch, before anything starts
        check_before_start(config)
    check_out_dir(out_dir)
    start_early()  # the warm server imports torch while this process does
    from hetrain.jobs import checkpoint
    from hetrain.jobs.interrupts import forget_stops, stop_received
    from hetrain.jobs.run import check_run_config, run_training

    forget_stops()

    for config in configs:
        check_run_config(config)
        if config.checkpoint_dir:  # every protocol's, before the first runs (it writes nothing)
            checkpoint.prepare(config.checkpoint_dir, config, config.resume)
    out = prepare_out_dir(out_dir)
    runs: list[dict] = []
    try:
        for index, config in enumerate(configs):
            label = f"[{index + 1}/{len(configs)}] {config.protocol}"
            runs.append(run_training(config, str(out / config.protocol), progress=progress, label=label,
                                     log_shared_dir=str(out)))  # --log mlflow: one store, a run per protocol
            if runs[-1].get("interrupted") or stop_received():  # stopped, or asked to as its record was written
                break
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM in a run's start-up: the runs before it are still compared
        if runs:
            _write_summary(runs, out)
        raise
    return _write_summary(runs, out)


def _write_summary(runs: list[dict], out: Path) -> dict:
    from hetrain.jobs.interrupts import held_while_writing

    with held_while_writing("the comparison's summary"):  # a stop now lets it be written whole
        summary = summarize(runs)
        write_json_atomic(out / "summary.json", summary)
        write_text_atomic(out / "summary.md", summary["table_markdown"] + "\n")
        plot_over_time(runs, out / "over_time.png")
    return summary


def summarize(runs: list[dict]) -> dict:
    base = next((r for r in runs if r["protocol"] == "allreduce"), None)
    rows = []
    for r in runs:
        row = {k: v for k, v in r.items() if k not in ("workers", "accuracy_curve", "throughput_series")}
        row["stale_dropped"] = f"{r.get('updates_stale', 0)} / {r.get('updates_dropped', 0)}"
        if r.get("updates_late"):  # Hop: of the stale ones, those used after missing their window
            row["stale_dropped"] = (f"{r['updates_stale']} ({r['updates_late']} late) / "
                                    f"{r.get('updates_dropped', 0)}")
        first, last = r.get("samples_per_s_first_quarter"), r.get("samples_per_s_last_quarter")
        row["rate_drift"] = last / first if first and last is not None else None
        row["loss_avg_model_quarter"] = loss_at_fraction(r, 0.25)
        final_loss, quarter = r.get("final_loss_avg_model"), row["loss_avg_model_quarter"]
        row["loss_drift"] = final_loss / quarter if final_loss is not None and quarter else None
        row["speedup_samples_per_s"] = (r["samples_per_s"] / base["samples_per_s"]
                                        if base and base.get("samples_per_s") else None)  # 0: nothing trained
        row["speedup_time_to_target"] = _ratio(base, r, "time_to_target_s")
        row["speedup_time_to_target_worst_worker"] = _ratio(base, r, "time_to_target_worst_worker_s")
        rows.append(row)
    notes = table_notes(runs)
    return {"runs": rows, "table_markdown": markdown_table(rows) + "\n\n" + notes,
            "table_console": console_table(rows) + "\n\n" + textwrap.fill(notes, CONSOLE_WIDTH)}


def loss_at_fraction(run: dict, fraction: float) -> float | None:
    """The averaged model's loss at the curve's point nearest ``fraction`` of the run's training time."""
    curve, wall = run.get("accuracy_curve") or [], run.get("wall_time_s")
    if not curve or not wall:
        return None
    return min(curve, key=lambda p: abs(p["t_s"] - fraction * wall)).get("loss_avg_model")


def _ratio(base: dict | None, run: dict, key: str) -> float | None:
    """allreduce's time over this run's (above 1: this run is faster); None if either is missing."""
    return base[key] / run[key] if base and base.get(key) and run.get(key) else None


def table_notes(runs: list[dict]) -> str:
    """What the table's efficiency and time-to-target columns measure, for this comparison."""
    bases = sorted({r.get("efficiency_basis") or "unknown" for r in runs})
    target = (f"validation loss {runs[0]['target_loss']:g}" if runs and runs[0].get("target_loss") is not None
              else f"test accuracy {runs[0]['target_accuracy']:g}" if runs else "the target")
    return (f"Heterogeneity efficiency: samples/s over the sum of the workers' standalone speeds, "
            f"{' and '.join(bases)} compute (emulated: --compute-ms times each slowdown; in-run: each worker's "
            f"own measured compute time per iteration). Time to target ({target}): 'avg model' is the "
            f"average of all workers' models, which no worker holds during training; 'worst worker' is "
            f"the first time every worker's own model reaches it. 'Loss end / at 1/4': the averaged model's "
            f"loss at the end over its loss at a quarter of the run (above 1: worse the longer it trained).")


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


def console_table(rows: list[dict]) -> str:
    """The table for a terminal: CONSOLE_COLUMNS, aligned, no line wider than CONSOLE_WIDTH (a protocol's
    name is cut to fit)."""
    cells = [[name for name, _, _ in CONSOLE_COLUMNS]]
    for row in rows:
        cells.append(["-" if row.get(key) is None else fmt.format(row[key]) for _, key, fmt in CONSOLE_COLUMNS])
    widths = [max(len(line[i]) for line in cells) for i in range(len(CONSOLE_COLUMNS))]
    others = sum(widths[1:]) + 3 * len(widths) + 1
    widths[0] = min(widths[0], max(8, CONSOLE_WIDTH - others))
    lines = ["| " + " | ".join(cell[:w].ljust(w) if i == 0 else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(line, widths))) + " |" for line in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def plot_over_time(runs: list[dict], path: Path) -> None:
    """Accuracy and loss (or validation loss) and throughput against wall time, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_loss = runs[0].get("target_loss") is not None
    fig, panels = plt.subplots(1, 2 if by_loss else 3, figsize=(12 if by_loss else 17, 4.5))
    quality, speed = panels[0], panels[-1]
    loss = None if by_loss else panels[1]
    for r in runs:
        curve = r.get("accuracy_curve") or []
        if curve:
            times = [p["t_s"] for p in curve]
            quality.plot(times, [p["loss_avg_model" if by_loss else "accuracy_avg_model"] for p in curve],
                         label=r["protocol"])
            if loss is not None:
                loss.plot(times, [p["loss_avg_model"] for p in curve], label=r["protocol"])
        series = r.get("throughput_series") or []
        if series:
            speed.plot([p["t_s"] for p in series], [p["samples_per_s"] for p in series], label=r["protocol"],
                       drawstyle="steps-pre")
    target = runs[0].get("target_loss") if by_loss else runs[0].get("target_accuracy")
    if target is not None:
        quality.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
    quality.set_ylabel("validation loss of the averaged model (nats/byte)" if by_loss
                       else "test accuracy of the averaged model")
    if not by_loss:
        quality.set_ylim(0, 1)
        loss.set_ylabel("test loss of the averaged model (log scale)")
        loss.set_yscale("log")
    speed.set_ylabel("samples/s (all workers, 5 s windows)")
    speed.set_ylim(bottom=0)
    for ax in panels:
        ax.set_xlabel("wall time (s)")
        ax.grid(alpha=0.3)
        ax.legend(loc="best")
    slow = runs[0].get("config", {}).get("slowdown", "")
    fig.suptitle(f"{runs[0]['num_workers']} workers, slowdown {slow}")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
