"""Training a model with a plan: ``hetrain plan --train`` and :func:`train_with_plan`.

One local gloo process per device of the array runs the plan's partitioned
step (:mod:`hetrain.planner.train_step`) on real batches, with the real loss
(cross-entropy) and optimizer (SGD with momentum, as ``hetrain train``), every
weight shard updated on the process that holds it, for ``steps`` steps; then
the test accuracy of the trained model, assembled from the shards and loaded
into the module itself. Devices are emulated: each compute block takes its
FLOPs at the device's FLOP/s and each exchange its bytes at the link's
bandwidth, both stretched by ``time_scale`` (emulated seconds per device
second; by default chosen so the plan's predicted step lasts 0.1 s), so the
measured step can be put beside the plan's prediction. At a few steps the
partitioned step is re-run in float64 from the gathered state and compared
with the unpartitioned model on the same batch (loss and every gradient).
Then DDP (torch's ``DistributedDataParallel``) runs on the same emulated
devices with the data-parallel plan's batch shares, for its measured step.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, field

from hetrain.errors import UsageError
from hetrain.planner.units import duration

WORKLOADS = ("cnn", "mlp", "cnn-residual")
SCHEMES = ("plan", "data-parallel", "one-weird-trick", "hypar")
TARGET_STEP_S = 0.1   # the plan's predicted step under the default time scale
CHECK_TOLERANCE = 1e-6
REPLICA_TOLERANCE = 1e-5  # float32 copies of one weight, updated alike in different orders of additions
TRAJECTORY_LENGTH = 3    # real optimizer steps per float64 window beside the whole model
DIGITS_SAMPLE = (64,)


def workload_module(name: str, seed: int = 0):
    """The model of a built-in workload (``cnn`` and ``mlp`` are ``hetrain train``'s)."""
    import torch

    from hetrain.data import build_model

    if name not in WORKLOADS:
        raise UsageError(f"--workload {name!r} is not one the planner trains; choose one of {', '.join(WORKLOADS)}")
    if name == "cnn-residual":
        from hetrain.planner.digits_models import ResidualDigitsCNN

        torch.manual_seed(seed)
        return ResidualDigitsCNN()
    return build_model(name, seed=seed)


@dataclass
class TrainReport:
    """What a training run with a plan measured; times are emulated seconds (``time_scale`` per device second)."""

    scheme: str
    devices: str
    batch: int
    steps: int
    time_scale: float
    types: list
    final_accuracy: float
    test_loss: float
    max_loss_diff_vs_unpartitioned: float
    max_grad_diff_vs_unpartitioned: float
    max_module_loss_diff: float
    max_update_diff_vs_whole_model: float
    max_trajectory_grad_diff: float
    replica_disagreement: float
    step_s_measured: float
    step_s_predicted: float
    dp_step_s_measured: float
    dp_step_s_predicted: float
    speedup_over_dp_predicted: float
    speedup_over_dp_measured: float
    compute_s_measured: float
    compute_s_predicted: float
    level_s_measured: list
    level_s_predicted: list
    level_bytes_measured: list
    level_bytes_predicted: list
    dp_split: str = "cost model"
    dp_splits: list = field(default_factory=list)
    checks: list = field(default_factory=list)
    trajectory: list = field(default_factory=list)
    loss_curve: list = field(default_factory=list)

    @property
    def checks_ok(self) -> bool:
        """Every check within its tolerance: the step against the unpartitioned model, the trajectory
        against the whole model (loss, gradients, parameters after each update), the copies of a weight."""
        exact = (self.max_loss_diff_vs_unpartitioned, self.max_grad_diff_vs_unpartitioned,
                 self.max_module_loss_diff, self.max_update_diff_vs_whole_model, self.max_trajectory_grad_diff)
        return (all(diff <= CHECK_TOLERANCE for diff in exact)  # a NaN fails: it is no agreement
                and self.replica_disagreement <= REPLICA_TOLERANCE and bool(self.trajectory))

    @property
    def slower_than_dp_measured(self) -> bool:
        """The plan's measured step is longer than the best data parallelism's on the same devices."""
        return self.speedup_over_dp_measured < 1.0

    @property
    def step_error(self) -> float:
        if not self.step_s_predicted > 0:
            return float("nan")
        return (self.step_s_measured - self.step_s_predicted) / self.step_s_predicted

    def json(self) -> dict:
        data = asdict(self)
        data.update(checks_ok=self.checks_ok, step_error=self.step_error,
                    slower_than_dp_measured=self.slower_than_dp_measured)
        return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in data.items()}

    def table(self) -> str:
        t = duration
        lines = [f"trained {self.scheme} ({', '.join(self.types)}) on {self.devices}, batch {self.batch}, "
                 f"{self.steps} steps; emulated devices, {self.time_scale:.3g} emulated s per device s", "",
                 f"{'':<34}{'predicted':>12}{'measured':>12}",
                 f"{'step (emulated)':<34}{t(self.step_s_predicted):>12}{t(self.step_s_measured):>12}"
                 f"   {self.step_error * 100:+.0f}%",
                 f"{'compute, slowest device':<34}{t(self.compute_s_predicted):>12}{t(self.compute_s_measured):>12}"]
        for k, (p, m) in enumerate(zip(self.level_s_predicted, self.level_s_measured)):
            lines.append(f"{f'level {k} exchanges':<34}{t(p):>12}{t(m):>12}")
        for k, (p, m) in enumerate(zip(self.level_bytes_predicted, self.level_bytes_measured)):
            lines.append(f"{f'level {k} bytes received (kB)':<34}{p / 1e3:>12.2f}{m / 1e3:>12.2f}")
        lines.append(f"{'data parallelism: DDP step':<34}{t(self.dp_step_s_predicted):>12}{t(self.dp_step_s_measured):>12}"
                     f"   best of: " + ", ".join(f"{run['split']} {run['samples']} {t(run['step_s_measured'])}"
                                                 for run in self.dp_splits))
        lines.append(f"{'speedup over data parallelism':<34}{self.speedup_over_dp_predicted:>11.2f}x"
                     f"{self.speedup_over_dp_measured:>11.2f}x"
                     + ("   SLOWER than data parallelism as measured" if self.slower_than_dp_measured else ""))
        moved = max((c["whole_model_moved"] for c in self.trajectory), default=float("nan"))
        lines += ["", f"final test accuracy {self.final_accuracy:.4f} (loss {self.test_loss:.4f})",
                  f"against the unpartitioned model ({len(self.checks)} checked steps, float64): loss "
                  f"{self.max_loss_diff_vs_unpartitioned:.1e}, gradients {self.max_grad_diff_vs_unpartitioned:.1e}, "
                  f"module {self.max_module_loss_diff:.1e}",
                  f"against the whole model trained alongside ({len(self.trajectory)} real optimizer steps in "
                  f"float64, windows of {TRAJECTORY_LENGTH}): parameters after each update "
                  f"{self.max_update_diff_vs_whole_model:.1e} (its updates moved them up to {moved:.1e}), loss and "
                  f"gradients {self.max_trajectory_grad_diff:.1e}",
                  f"copies of a weight on several devices differ by {self.replica_disagreement:.1e} "
                  f"(tolerance {REPLICA_TOLERANCE:g})",
                  f"checks {'ok' if self.checks_ok else 'FAILED'} (tolerance {CHECK_TOLERANCE:g})"]
        return "\n".join(lines)


def check_steps(steps: int, count: int = 5) -> tuple:
    """``count`` steps spread over the run, the first and the last included."""
    if steps <= count:
        return tuple(range(steps))
    return tuple(sorted({round(k * (steps - 1) / (count - 1)) for k in range(count)}))


def train_with_plan(module, data, sample_shape, devices, batch: int = 64, steps: int = 300, scheme: str = "plan",
                    time_scale: float | None = None, lr: float = 0.1, momentum: float = 0.9, seed: int = 0,
                    ddp_steps: int = 30, timeout_s: float = 600.0, types: int = 3, progress: bool = True,
                    name: str = "model", plans: dict | None = None) -> TrainReport:
    """Train ``module`` (Linear/Conv2d layers, ReLU, flattening; residual additions) with the plan
    ``scheme`` for ``devices`` (a spec like ``tpu-v3:2,tpu-v2:2`` or a list of devices) and report.

    ``ddp_steps``: DDP's timed steps on the same emulated devices (0: no DDP run). ``data``: a
    :class:`hetrain.data.Dataset` (train and test tensors); ``sample_shape``: one sample's
    shape as the module reads it; ``plans``: the plans by scheme (:func:`hetrain.planner.api.compare_plans`'s,
    planned for float32) when already made. Raises :class:`UsageError` for what the executor cannot run.
    """
    from hetrain.jobs import run_local
    from hetrain.planner import api
    from hetrain.planner.execute import Program
    from hetrain.planner.measure import _leaves, predicted_levels
    from hetrain.planner.trace import trace
    from hetrain.planner.train_check import check_windows
    from hetrain.planner.train_worker import Emulation, TrainJob, ddp_worker, plan_worker

    if scheme not in SCHEMES:
        raise UsageError(f"--scheme {scheme!r}: choose one of {', '.join(SCHEMES)}")
    if steps < 1 or batch < 1:
        raise UsageError(f"--steps and --batch must be at least 1 (got {steps}, {batch})")
    devs = api.devices(devices) if isinstance(devices, str) else list(devices)
    if not 2 <= len(devs) <= 8:
        raise UsageError(f"--train runs one process per device: use 2 to 8 devices, not {len(devs)}")
    if batch < len(devs):
        raise UsageError(f"--batch {batch} is smaller than the {len(devs)} devices; use at least one sample each")
    net = trace(module, tuple(sample_shape), name)
    if plans is None:
        plans = api.compare_plans(net, batch, devs, types=types, dtype_bytes=4.0, optimizer="momentum").plans
    plan, dp = plans[scheme], plans["data-parallel"]
    program = Program(net, batch, plan)  # unsupported models fail here, before any process starts
    if time_scale is None:
        time_scale = TARGET_STEP_S / plan.step_s if plan.step_s > 0 else 1.0
    if not (time_scale > 0 and math.isfinite(time_scale)):
        raise UsageError(f"--time-scale must be a positive number, got {time_scale}")
    emu = Emulation(tuple(d.flops_per_s for d in devs), tuple(d.link_bytes_per_s for d in devs), time_scale)
    checked = check_steps(steps)
    job = TrainJob(module, data, batch, steps, checked, lr, momentum, seed, emu,
                   trajectory_steps=check_windows(checked, steps, TRAJECTORY_LENGTH))
    bar, on_message = _progress(steps, scheme, progress)
    try:
        results = run_local(plan_worker, len(devs), (job, program), timeout_s=timeout_s, job_timeout_s=timeout_s,
                            on_message=on_message, stoppable=False)
    finally:
        if bar is not None:
            bar.close()
    splits = dp_splits(net, batch, dp, len(devs))
    grad_bytes = 4.0 * sum(p.numel() for p in module.parameters())
    ddp = None
    if ddp_steps > 0:
        ddp = run_local(ddp_worker, len(devs), (job, [(shares, flops) for _, shares, flops in splits], grad_bytes,
                                                ddp_steps), timeout_s=timeout_s, job_timeout_s=timeout_s,
                        stoppable=False)
    return _report(scheme, devs, batch, steps, time_scale, plan, dp, results, ddp, splits, predicted_levels, _leaves)


def dp_splits(net, batch: int, dp, world: int) -> list:
    """The data parallelisms DDP runs: (name, samples per rank, FLOPs per rank) for the cost model's
    ratio (the data-parallel plan's shares) and for the even split, once if both are the same."""
    from hetrain.planner.execute import Program
    from hetrain.planner.shapes import first_layers

    program = Program(net, batch, dp)
    modelled = [program.input_box(0, r)[:2] for r in range(world)]
    cuts = [round(r * batch / world) for r in range(world + 1)]
    even = list(zip(cuts[:-1], cuts[1:]))
    firsts = first_layers(net)
    out = []
    for name, shares in (("cost model", modelled), ("even", even)):
        if any(shares == known for _, known, _ in out):
            continue
        flops = [sum(la.flops(b1 - b0) * (2 if i in firsts else 3) for i, la in enumerate(net.layers))
                 for b0, b1 in shares]
        out.append((name, shares, flops))
    return out


def _report(scheme, devs, batch, steps, scale, plan, dp, results, ddp, splits, predicted_levels,
            leaves) -> TrainReport:
    from hetrain.planner.devices import describe
    from hetrain.planner.train_check import worst

    checks = [{key: max(r["checks"][k][key] for r in results) for key in results[0]["checks"][k]}
              for k in range(len(results[0]["checks"]))]
    trajectory = results[0]["trajectory"]  # every rank's entries are the maxima over all ranks
    step_measured = max(r["step_s"] for r in results)
    runs = [{"split": name, "samples": [b1 - b0 for b0, b1 in shares],
             "step_s_measured": max(r["step_s"][j] for r in ddp) if ddp else float("nan")}
            for j, (name, shares, _) in enumerate(splits)]
    best = min(runs, key=lambda run: run["step_s_measured"]) if ddp else runs[0]
    dp_measured = best["step_s_measured"]
    level_pred, bytes_pred = predicted_levels(plan)
    levels = len(results[0]["level_s"])
    losses = results[0]["losses"]
    every = max(1, len(losses) // 30)
    return TrainReport(
        scheme=scheme, devices=describe(devs), batch=batch, steps=steps, time_scale=scale,
        types=[f"g{k}: " + "/".join(("I", "II", "III")[t] for t in g.assignment.types) for k, g in
               enumerate(plan.levels())],
        final_accuracy=results[0]["accuracy"], test_loss=results[0]["test_loss"],
        max_loss_diff_vs_unpartitioned=max(c["loss_diff"] for c in checks),
        max_grad_diff_vs_unpartitioned=max(c["grad_diff"] for c in checks),
        max_module_loss_diff=max(c["module_loss_diff"] for c in checks),
        max_update_diff_vs_whole_model=worst(t["param_diff"] for t in trajectory),
        max_trajectory_grad_diff=worst(d for t in trajectory for d in (t["grad_diff"], t["loss_diff"])),
        replica_disagreement=worst(r["replica_disagreement"] for r in results),
        step_s_measured=step_measured, step_s_predicted=plan.step_s * scale,
        dp_step_s_measured=dp_measured, dp_step_s_predicted=dp.step_s * scale,
        speedup_over_dp_predicted=dp.step_s / plan.step_s if plan.step_s > 0 else float("nan"),
        speedup_over_dp_measured=dp_measured / step_measured,
        compute_s_measured=max(r["compute_s"] for r in results),
        compute_s_predicted=max(leaf.compute_s for leaf in leaves(plan)) * scale,
        level_s_measured=[max(r["level_s"][j] for r in results) for j in range(levels)],
        level_s_predicted=[s * scale for s in level_pred],
        level_bytes_measured=[sum(r["level_bytes"][j] for r in results) for j in range(levels)],
        level_bytes_predicted=list(bytes_pred), dp_split=best["split"], dp_splits=runs,
        checks=checks, trajectory=trajectory, loss_curve=[[k + 1, losses[k]] for k in range(0, len(losses), every)])


def _progress(steps: int, scheme: str, show: bool):
    if not show:
        return None, None
    from tqdm import tqdm

    bar = tqdm(total=steps, desc=f"training with {scheme}", unit="step", file=sys.stderr, leave=False)

    def on_message(rank, message):
        if isinstance(message, tuple) and message and message[0] == "step":
            bar.n = message[1]
            bar.set_postfix(loss=f"{message[2]:.3f}")
            bar.refresh()

    return bar, on_message


def train_workload(workload: str = "cnn", devices="tpu-v3:2,tpu-v2:2", batch: int = 64, steps: int = 300,
                   scheme: str = "plan", **options) -> TrainReport:
    """A built-in workload on digits (``cnn``, ``mlp``: ``hetrain train``'s models; ``cnn-residual``)."""
    from hetrain.data import load_dataset

    module = workload_module(workload, options.get("seed", 0))
    data = load_dataset("cnn" if workload == "cnn-residual" else workload, options.get("seed", 0))
    return train_with_plan(module, data, DIGITS_SAMPLE, devices, batch, steps, scheme, name=workload, **options)
