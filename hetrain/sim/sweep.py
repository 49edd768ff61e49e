"""Scaling sweeps: one simulated run per (protocol, worker count), as a table and a plot."""

from __future__ import annotations

from collections.abc import Callable
from math import nan

from hetrain.config import RunConfig
from hetrain.sim.runner import SimOptions, simulate

TABLE_FIELDS = ("protocol", "num_workers", "wall_time_s", "samples_per_s", "ideal_samples_per_s",
                "heterogeneity_efficiency", "final_accuracy_avg_model", "engine_events", "sim_runtime_s")


def run_sweep(make_config: Callable[[str, int], RunConfig], protocols: list[str], counts: list[int],
              options: SimOptions, model_params: int | None = None, on_run=None) -> list[dict]:
    """Simulate every (protocol, count); return one table row per run (and pass each record to on_run).

    ``make_config(protocol, workers)`` gives each run's configuration.
    """
    rows = []
    for protocol in protocols:
        for n in counts:
            record = simulate(make_config(protocol, n), options, model_params)
            if on_run is not None:
                on_run(record)
            rows.append({key: record.get(key) for key in TABLE_FIELDS})
    return rows


def markdown_table(rows: list[dict]) -> str:
    header = "| protocol | workers | sim. wall s | samples/s | ideal samples/s | het. efficiency | accuracy | events | runtime s |"
    lines = [header, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        acc = "-" if r["final_accuracy_avg_model"] is None else f"{r['final_accuracy_avg_model']:.3f}"
        eff = "-" if r["heterogeneity_efficiency"] is None else f"{r['heterogeneity_efficiency']:.3f}"
        lines.append(
            f"| {r['protocol']} | {r['num_workers']} | {r['wall_time_s']:.2f} | {r['samples_per_s']:.0f} | "
            f"{r['ideal_samples_per_s']:.0f} | {eff} | {acc} | "
            f"{r['engine_events']} | {r['sim_runtime_s']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def plot_sweep(rows: list[dict], path) -> None:
    """Heterogeneity efficiency and samples/s against workers, one line per protocol (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_eff, ax_rate) = plt.subplots(1, 2, figsize=(11, 4.2))
    for protocol in dict.fromkeys(r["protocol"] for r in rows):
        mine = sorted((r for r in rows if r["protocol"] == protocol), key=lambda r: r["num_workers"])
        xs = [r["num_workers"] for r in mine]
        ax_eff.plot(xs, [nan if r["heterogeneity_efficiency"] is None else r["heterogeneity_efficiency"]
                         for r in mine], marker="o", label=protocol)  # None (no ideal): a gap
        ax_rate.plot(xs, [r["samples_per_s"] for r in mine], marker="o", label=protocol)
    for ax, label in ((ax_eff, "heterogeneity efficiency"), (ax_rate, "samples/s (simulated)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    ax_eff.set_ylim(0, 1.05)
    ax_rate.set_yscale("log")
    ax_eff.legend()
    fig.suptitle("hetrain simulate: scaling")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
