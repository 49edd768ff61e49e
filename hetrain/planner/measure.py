"""Predicted against measured: run the planned partitioning for real and compare with the cost model.

:func:`measure` runs :mod:`hetrain.planner.execute` on one local gloo process
per device of the array (float32, one thread each; one warm-up step, then
``steps`` timed steps, median reported) and puts beside the plan's prediction:

- the step (wall time of the slowest process),
- compute (per process: its multiplications, post-operations and loss; the
  model's figure is its leaf's training FLOPs at the device's FLOP/s),
- communication per level (per process: time in that level's exchanges,
  waiting for the partner included; the model's figure is the level's
  exchange time), and the bytes actually received at each level against the
  bytes the model counts.

Calibrate first: ``hetrain profile --workers N --out cpu.yaml`` measures this
machine's matmul FLOP/s and gloo bandwidth with N processes running at once.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field

from hetrain.errors import UsageError


@dataclass
class Measurement:
    world: int
    steps: int
    predicted: dict
    measured: dict
    calibrated: dict = field(default_factory=dict)
    per_rank: list = field(default_factory=list)
    check: dict = field(default_factory=dict)

    def json(self) -> dict:
        return {"processes": self.world, "timed_steps": self.steps, "predicted": self.predicted,
                "predicted_calibrated": self.calibrated, "measured": self.measured, "per_rank": self.per_rank,
                "check": self.check}

    def error(self, key: str = "step_s", level: int | None = None) -> float:
        """Relative error of the calibrated prediction against the measurement."""
        p = self.calibrated or self.predicted
        pv, mv = (p[key], self.measured[key]) if level is None else (p["level_s"][level], self.measured["level_s"][level])
        return (pv - mv) / mv if mv > 0 else float("nan")

    def table(self) -> str:
        cal = self.calibrated or self.predicted
        levels = len(self.predicted["level_s"])
        rows = [("step", "step_s", None), ("compute (slowest process)", "compute_s", None)]
        rows += [(f"level {k} communication", "level_s", k) for k in range(levels)]
        lines = [f"measured on {self.world} local gloo processes (float32, 1 thread each; median of "
                 f"{self.steps} steps after a warm-up); 'calibrated': the device file's FLOP/s, bandwidth and "
                 "latency replaced by those measured just before each step ('-': not calibrated, and the error "
                 "is the prediction's); latency (not in the planner's "
                 f"search) added per exchange round ({sum(self.predicted.get('rounds', []))} per step); "
                 "the bytes rows are in MB", "",
                 f"{'':<28}{'predicted ms':>14}{'calibrated ms':>15}{'measured ms':>13}{'error':>8}"]
        for label, key, k in rows:
            get = (lambda d: d[key]) if k is None else (lambda d: d["level_s"][k])  # noqa: B023
            p, c, m = get(self.predicted), get(cal), get(self.measured)
            err = f"{(c - m) / m * 100:+.0f}%" if m > 0 else "-"
            shown = f"{get(self.calibrated) * 1e3:.2f}" if self.calibrated else "-"  # none without calibration
            lines.append(f"{label:<28}{p * 1e3:>14.2f}{shown:>15}{m * 1e3:>13.2f}{err:>8}")
        lines.append(f"{'waiting at exchanges':<28}{'-':>14}{'-':>15}{self.measured['wait_s'] * 1e3:>13.2f}")
        other = self.measured["step_s"] - self.measured["compute_s"] - self.measured["wait_s"] - sum(
            self.measured["level_s"])
        lines.append(f"{'other (local copies, loss)':<28}{'-':>14}{'-':>15}{other * 1e3:>13.2f}")
        for k, (pb, mb) in enumerate(zip(self.predicted["level_bytes"], self.measured["level_bytes"])):
            lines.append(f"{f'level {k} bytes (all pairs)':<28}{pb / 1e6:>12.2f}MB{'-':>15}{mb / 1e6:>11.2f}MB")
        if self.check:
            ok = "ok" if self.check["ok"] else "FAILED"
            lines.append(f"check against the unpartitioned step: outputs {self.check['output_rel_err']:.1e}, "
                         f"weight gradients {self.check['grad_rel_err']:.1e} (relative) {ok}")
        return "\n".join(lines)


def predicted_levels(plan):
    """Per depth: the slowest group's exchange seconds, and the bytes of all groups at that depth."""
    seconds, nbytes = {}, {}
    stack = [(plan, 1)]
    while stack:
        g, mult = stack.pop()
        if g.assignment is None:
            continue
        seconds[g.depth] = max(seconds.get(g.depth, 0.0), g.level_comm_s)
        nbytes[g.depth] = nbytes.get(g.depth, 0.0) + g.level_comm_bytes
        stack += [(g.left, 1), (g.right, 1)]
    depth = max(seconds) + 1 if seconds else 0
    return [seconds.get(k, 0.0) for k in range(depth)], [nbytes.get(k, 0.0) for k in range(depth)]


def _leaves(plan):
    if plan.assignment is None:
        return [plan]
    return _leaves(plan.left) + _leaves(plan.right)


def rescaled(plan, compute_factor: float = 1.0, comm_factor: float = 1.0, latency_s: float = 0.0,
             rounds=()) -> dict:
    """The plan's prediction with every compute time times ``compute_factor``, every exchange time
    times ``comm_factor`` (one kind of device and link: what a new FLOP/s or bandwidth does), and
    ``latency_s`` per exchange round (``rounds[level]`` of them per step; the search has no latency)."""
    def walk(g):
        if g.assignment is None:
            return g.compute_s * compute_factor, g.compute_s * compute_factor
        (ls, lc), (rs, rc) = walk(g.left), walk(g.right)
        slow = (ls, lc) if ls >= rs else (rs, rc)
        return slow[0] + g.level_comm_s * comm_factor, slow[1]

    step, compute = walk(plan)
    seconds, nbytes = predicted_levels(plan)
    level_s = [s * comm_factor + latency_s * (rounds[k] if k < len(rounds) else 0) for k, s in enumerate(seconds)]
    return {"step_s": step + latency_s * sum(rounds), "compute_s": compute, "level_s": level_s, "level_bytes": nbytes,
            "latency_s": latency_s, "rounds": list(rounds)}


def measure(net, batch: int, plan, devices, steps: int = 3, timeout_s: float = 600.0, check: bool = True,
            calibrate_s: float = 1.0) -> Measurement:
    """Run ``plan`` (for ``devices``) for real; ``calibrate_s`` > 0 also measures FLOP/s, bandwidth and
    latency for that long before each timed step (the 'calibrated' prediction)."""
    from hetrain.jobs import run_local
    from hetrain.planner.execute import Program
    from hetrain.planner.measure_worker import worker

    world = plan.num_devices
    if world < 2:
        raise UsageError("--measure needs an array of at least 2 devices")
    if world > 8:
        raise UsageError(f"--measure runs one process per device; {world} is too many for one machine (at most 8)")
    program = Program(net, batch, plan)
    from tqdm import tqdm

    with tqdm(total=steps + 1, desc=f"measuring the plan on {world} processes (a warm-up, then {steps} steps)",
              unit="step", file=sys.stderr, leave=False) as bar:
        def on_message(rank, message):
            if isinstance(message, dict) and "measured_step" in message:
                bar.update(1)

        results = run_local(worker, world, (program, "float32", steps, check, calibrate_s), backend="gloo",
                            timeout_s=timeout_s, job_timeout_s=timeout_s, stoppable=False, on_message=on_message)
    levels = len(results[0]["steps"][0]["level_s"])
    per_step = []
    for k in range(steps):
        recs = [r["steps"][k] for r in results]
        per_step.append({"step_s": max(x["step_s"] for x in recs), "compute_s": max(x["compute_s"] for x in recs),
                         "level_s": [max(x["level_s"][j] for x in recs) for j in range(levels)],
                         "level_bytes": [sum(x["level_bytes"][j] for x in recs) for j in range(levels)]})
    for k, s in enumerate(per_step):
        s["wait_s"] = max(r["steps"][k]["wait_s"] for r in results)
    med = {key: statistics.median(s[key] for s in per_step) for key in ("step_s", "compute_s", "wait_s")}
    med["level_s"] = [statistics.median(s["level_s"][j] for s in per_step) for j in range(levels)]
    med["level_bytes"] = per_step[0]["level_bytes"]
    med["min_step_s"] = min(s["step_s"] for s in per_step)
    latency = max(d.link_latency_s for d in devices)
    predicted = rescaled(plan, latency_s=latency, rounds=program.rounds)
    leaves = _leaves(plan)
    per_rank = [{"rank": r["rank"], "predicted_compute_s": leaves[r["rank"]].compute_s,
                 "measured_compute_s": statistics.median(s["compute_s"] for s in r["steps"]),
                 "measured_level_s": [statistics.median(s["level_s"][j] for s in r["steps"]) for j in range(levels)]}
                for r in results]
    calibrated = {}
    if calibrate_s and len({d.kind for d in devices}) == 1:
        # one kind of device: the model's figures scaled by those measured just before each step
        d, each = devices[0], []
        for k in range(steps):
            cals = [r["steps"][k]["calibration"] for r in results]
            flops = min(c["flops_per_s"] for c in cals)
            link = min(c["recv_bytes_per_s"] for c in cals)
            round_s = max(c["round_s"] for c in cals)
            each.append(rescaled(plan, d.flops_per_s / flops, d.link_bytes_per_s / link, round_s, program.rounds))
            each[-1].update(flops_per_s=flops, link_bytes_per_s=link)
        calibrated = {key: statistics.median(e[key] for e in each)
                      for key in ("step_s", "compute_s", "flops_per_s", "link_bytes_per_s", "latency_s")}
        calibrated["level_s"] = [statistics.median(e["level_s"][j] for e in each) for j in range(levels)]
        calibrated["level_bytes"], calibrated["rounds"] = each[0]["level_bytes"], each[0]["rounds"]
        calibrated["step_errors"] = [(e["step_s"] - s["step_s"]) / s["step_s"] for e, s in zip(each, per_step)]
    result = Measurement(world, steps, predicted, med, calibrated, per_rank)
    if check:
        out_rel = max(r["output_err"] for r in results) / max(max(r["output_scale"] for r in results), 1e-30)
        grad_rel = max(r["grad_err"] for r in results) / max(max(r["grad_scale"] for r in results), 1e-30)
        result.check = {"output_rel_err": out_rel, "grad_rel_err": grad_rel, "ok": out_rel < 1e-3 and grad_rel < 1e-3}
    return result
