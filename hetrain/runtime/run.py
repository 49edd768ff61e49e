"""Run one training job (local processes or under torchrun) and write its record.

``run_training(config, out_dir)`` validates everything first (so bad input
writes nothing), spawns ``config.num_workers`` local gloo/NCCL processes with
a progress bar, evaluates the models the workers snapshotted along the way,
and writes ``OUT/metrics.json`` (atomically) plus ``OUT/summary.txt``. A job
stopped by Ctrl-C still writes what it has (``"interrupted": true``); a failed
job writes every worker's traceback to ``OUT/errors.log``.
Under torchrun, ``run_training_torchrun`` does the same from inside the job.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
from tqdm import tqdm

from hetrain.config import RunConfig
from hetrain.data import build_model, evaluate, load_dataset
from hetrain.metrics import build_metrics, format_summary
from hetrain.outputs import prepare_out_dir, write_json_atomic, write_text_atomic
from hetrain.protocols.options import OptionError
from hetrain.runtime.flat_state import FlatState
from hetrain.runtime.local_job import run_local
from hetrain.runtime.process_guard import die_with_parent
from hetrain.runtime.train_worker import train_worker
from hetrain.slowdown import parse_slowdown


def check_run_config(config: RunConfig) -> RunConfig:
    """Every check that can be made before a process starts; raises UsageError."""
    config.validate()
    parse_slowdown(config.slowdown, config.seed).check_workers(config.num_workers)
    if config.device == "cuda" and not torch.cuda.is_available():
        raise OptionError("{device} cuda was asked for, but this machine has no CUDA device; use {device} cpu")
    return config


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def run_training(config: RunConfig, out_dir: str | None, progress: bool = True, label: str | None = None) -> dict:
    """Spawn the local job, then evaluate and record it; returns the metrics record."""
    check_run_config(config)
    out = prepare_out_dir(out_dir) if out_dir else None
    bar = _ProgressBar(config, label or config.protocol, enabled=progress)
    try:
        results = run_local(
            train_worker, config.num_workers, (config,),
            backend="nccl" if config.device == "cuda" else "gloo",
            timeout_s=config.timeout_s, job_timeout_s=_job_timeout_s(config), on_message=bar.update,
            log_path=out / "errors.log" if out is not None else None,
        )
    finally:
        bar.close()
    return finalize_run(config, results, out, interrupted=results.interrupted)


def run_training_torchrun(config: RunConfig, out_dir: str | None) -> dict | None:
    """Run as one rank of a torchrun job; rank 0 gathers, evaluates and writes the record."""
    import torch.distributed as dist

    from hetrain.runtime.context import WorkerContext
    from hetrain.runtime.job import init

    die_with_parent(os.getppid())  # torchrun's agent: no orphan if it is killed
    device = init("nccl" if config.device == "cuda" else "gloo", timeout_s=config.timeout_s)
    ctx = WorkerContext(dist.get_rank(), dist.get_world_size(), device, config.timeout_s)
    config = config.replace(num_workers=ctx.world_size)
    check_run_config(config)
    out = prepare_out_dir(out_dir) if out_dir and ctx.rank == 0 else None
    result = train_worker(ctx, config)
    gathered = [None] * ctx.world_size if ctx.rank == 0 else None
    dist.gather_object(result, gathered, dst=0)
    dist.barrier()
    if ctx.rank != 0:
        return None
    return finalize_run(config, gathered, out)


def finalize_run(config: RunConfig, results: list[dict], out, interrupted: bool = False) -> dict:
    workers = [r["worker"] for r in results]
    curve = evaluation_curve(config, [r["snapshots"] for r in results])
    metrics = build_metrics(
        protocol=config.protocol,
        workers=workers,
        wall_time_s=max(w["loop_s"] for w in workers),
        batch_size=config.batch_size,
        standalone_iteration_s=[w["standalone_iteration_s"] for w in workers],
        accuracy_curve=curve,
        target_accuracy=config.target_accuracy,
        target_loss=config.resolved_target_loss(),
        final_accuracy_avg_model=workers[0]["consensus_accuracy"],
        final_accuracy_worst_worker=min(w["local_accuracy"] for w in workers),
        final_loss_avg_model=workers[0]["consensus_loss"],
        consensus_distance=workers[0].get("consensus_distance"),
        extra={"interrupted": interrupted, "config": dict(vars(config))},
    )
    if out is not None:
        write_json_atomic(out / "metrics.json", metrics)
        write_text_atomic(out / "summary.txt", format_summary(metrics) + "\n")
    return metrics


def evaluation_curve(config: RunConfig, snapshots_by_worker: list[list]) -> list[dict]:
    """Accuracy and loss of the average of the workers' models at each snapshot time.

    Snapshots are ``(due_s, t_s, iteration, flat)``; at each due time every worker
    contributes its latest snapshot due at or before it.
    """
    if not all(snapshots_by_worker):
        return []
    data = load_dataset(config.workload, config.seed)
    model = build_model(config.workload, config.model_params, config.seed)
    state = FlatState(model)
    due_times = sorted({snap[0] for snaps in snapshots_by_worker for snap in snaps})
    curve = []
    for due in due_times:
        chosen = []
        for snaps in snapshots_by_worker:
            before = [s for s in snaps if s[0] <= due]
            chosen.append(before[-1] if before else snaps[0])
        mean = torch.from_numpy(np.mean([s[3] for s in chosen], axis=0))
        state.scatter(mean)
        accuracy, loss = evaluate(model, data.x_test, data.y_test)
        curve.append({
            "t_s": max(s[1] for s in chosen),
            "accuracy_avg_model": accuracy,
            "loss_avg_model": loss,
            "min_iteration": min(s[2] for s in chosen),
            "max_iteration": max(s[2] for s in chosen),
        })
    return curve


def _job_timeout_s(config: RunConfig) -> float | None:
    if config.time_budget_s is not None:
        return config.time_budget_s + 10 * config.timeout_s
    return None


class _ProgressBar:
    """Progress of the slowest worker, from the workers' reports (stderr, tqdm)."""

    def __init__(self, config: RunConfig, label: str, enabled: bool):
        self.by_time = config.iterations is None
        total = config.time_budget_s if self.by_time else config.iterations
        self.state: dict[int, dict] = {}
        self.bar = tqdm(total=total, desc=label, unit="s" if self.by_time else "it", file=sys.stderr,
                        disable=not enabled, leave=False, dynamic_ncols=True,
                        mininterval=0.1 if sys.stderr.isatty() else 5.0,
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total} {unit} {postfix}")

    def update(self, rank: int, message: dict) -> None:
        self.state[rank] = message
        values = [m["t_s"] if self.by_time else m["iteration"] for m in self.state.values()]
        self.bar.n = min(max(values) if self.by_time else min(values), self.bar.total)
        computed = sum(m["computed"] for m in self.state.values())
        self.bar.set_postfix_str(f"{computed} gradients, {len(self.state)} workers reporting", refresh=False)
        self.bar.update(0)  # redraws at most every mininterval

    def close(self) -> None:
        self.bar.close()
