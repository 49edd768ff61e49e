"""Plans as JSON and as a readable table.

Units: seconds per training step (``*_s``; the table prints each time in the unit that shows it), bytes per step summed over every
pair of halves at every level (``comm_bytes``), bytes per device
(``memory_bytes_per_device``: the largest of any device: weights and their
gradients at ``dtype_bytes`` per element, the optimizer's state, and the
activations kept for backward; ``memory_fits``: every device within its
capacity). Speedups are the baseline's step time divided by the plan's.
"""

from __future__ import annotations

from hetrain.planner.cost import LAYOUT_NAMES, TYPE_NAMES
from hetrain.planner.hierarchy import GroupPlan
from hetrain.planner.layers import Net
from hetrain.planner.units import duration, size

MAX_TABLE_GROUPS = 12


def plan_json(p: GroupPlan) -> dict:
    levels = []
    for g in p.levels():
        levels.append({
            "depth": g.depth, "devices": g.devices, "num_devices": g.num_devices, "ratio": round(g.alpha, 6),
            "types": [TYPE_NAMES[t] for t in g.assignment.types],
            "joins": [LAYOUT_NAMES[m] + LAYOUT_NAMES[m2] for m, m2 in g.assignment.joins],
            "level_comm_s": g.level_comm_s, "level_comm_bytes": g.level_comm_bytes,
        })
    out = {"step_s": p.step_s, "compute_s": p.compute_s, "comm_s": p.comm_s, "comm_bytes": p.comm_bytes,
           "memory_bytes_per_device": p.memory_bytes, "levels": levels}
    if p.worst is not None:
        out["memory_fits"] = p.fits
        out["memory_tightest"] = {"device": p.worst.kind, "need_bytes": p.worst.need,
                                  "capacity_bytes": p.worst.capacity}
    if p.penalty_weight:
        out["memory_penalty_weight"] = p.penalty_weight
    return out


def to_json(net: Net, batch: int, devices: str, plans: dict[str, GroupPlan], settings: dict) -> dict:
    """The whole comparison: model, settings, each plan, and the plan's speedup over each baseline."""
    main = plans["plan"]
    return {
        "model": net.name, "params": net.total_params, "batch": batch, "devices": devices, **settings,
        "layers": [{"name": la.name, "kind": la.kind, "d_in": la.d_in, "d_out": la.d_out, "kernel": la.kernel,
                    "hw_in": la.hw_in, "hw_out": la.hw_out} for la in net.layers],
        "plans": {name: plan_json(p) for name, p in plans.items()},
        "speedup_over": {name: p.step_s / main.step_s for name, p in plans.items() if name != "plan"},
        "comm_reduction_over": {name: p.comm_bytes / main.comm_bytes if main.comm_bytes else None
                                for name, p in plans.items() if name != "plan"},
    }


def table(net: Net, batch: int, devices: str, plans: dict[str, GroupPlan], settings: dict) -> str:
    """A human summary: one row per plan/baseline, then the plan's type per layer and group."""
    main = plans["plan"]
    search = settings.get("search", "greedy")
    if search == "lookahead":
        search += f" (depth {settings['depth']}, width {settings['width']})"
    lines = [f"{net.name} ({net.total_params / 1e6:.1f}M params, {len(net.layers)} weighted layers, "
             f"{net.num_adds} joins), batch {batch}, devices {devices}, objective {settings['objective']}, "
             f"{settings['types']} types, {settings['dtype_bytes']} bytes/element, search {search}",
             f"memory per device: weights + gradients + {settings.get('optimizer', 'sgd')} state + kept activations"
             + (", kept within each device's capacity" if settings.get("memory_enforced") else ", not enforced"), ""]
    head = f"{'scheme':<16} {'step':>10} {'compute':>11} {'comm':>10} {'comm bytes':>11} " \
           f"{'mem/dev':>12} {'plan speedup':>13}"
    lines += [head, "-" * len(head)]
    for name, p in plans.items():
        speed = "-" if name == "plan" else f"{p.step_s / main.step_s:.2f}x"
        mem = size(p.memory_bytes) + ("" if p.fits else " !")
        lines.append(f"{name:<16} {duration(p.step_s):>10} {duration(p.compute_s):>11} {duration(p.comm_s):>10} "
                     f"{size(p.comm_bytes, binary=False):>11} {mem:>12} {speed:>13}")
    over = [f"{name} (a {p.worst.kind} needs {p.worst.need / 2**30:.2f} of {p.worst.capacity / 2**30:.2f} GiB)"
            for name, p in plans.items() if not p.fits]
    if over:
        lines.append("! does not fit in memory: " + "; ".join(over))
    groups = main.levels()
    shown = groups[:MAX_TABLE_GROUPS]
    lines += ["", "plan: layer type per group (gN: depth, devices, share of the left half)"]
    lines += [f"  g{k}: depth {g.depth}, {g.devices}, ratio {g.alpha:.3f}" for k, g in enumerate(shown)]
    cols = [f"g{k}" for k in range(len(shown))]
    width = 4
    name_w = max(len(la.name) for la in net.layers) + 2
    lines.append(" " * name_w + " ".join(f"{c:>{width}}" for c in cols))
    for i, la in enumerate(net.layers):
        cells = " ".join(f"{TYPE_NAMES[g.assignment.types[i]]:>{width}}" for g in shown)
        lines.append(f"{la.name:<{name_w}}{cells}")
    if len(groups) > len(shown):
        lines.append(f"({len(groups) - len(shown)} more distinct groups in the JSON output)")
    return "\n".join(lines)
