"""The processes of ``hetrain plan --measure`` and of the executor's tests: timed steps of a plan and
the check against the unpartitioned step (:mod:`hetrain.planner.execute` runs the step)."""

from __future__ import annotations

import time

from hetrain.planner.execute import Program, _Clock, _Comm, _Step, gradient_error

__all__ = ["check_worker", "worker"]


def worker(ctx, program: Program, dtype_name: str, steps: int, check: bool, calibrate_s: float = 0.0,
           sync: bool = True) -> dict:
    """One rank (run by :func:`hetrain.jobs.local_job.run_local`): a warm-up step, ``steps`` timed
    steps (each right after ``calibrate_s`` seconds of FLOP/s and bandwidth measurement, when > 0, so
    that a shared machine's drift affects both alike), and the check against the unpartitioned step."""
    import torch
    import torch.distributed as dist

    from hetrain.planner.profile import calibrate

    result = {"rank": ctx.rank}
    dtype = getattr(torch, dtype_name)
    levels = max((len(path) for path in program.layout.paths), default=1)
    step = _Step(program, ctx.rank, torch, dist, dtype)
    records, pool = [], {}
    for k in range(steps + 1):  # the first is a warm-up
        cal = calibrate(ctx.rank, ctx.world_size, calibrate_s) if (k and calibrate_s) else None
        comm, clock = _Comm(torch, dist, ctx.rank, dtype, levels, sync, pool), _Clock()
        dist.barrier()
        start = time.perf_counter()
        output, grads = step.run(comm, clock)
        wall = time.perf_counter() - start
        if k:
            records.append({"step_s": wall, "compute_s": clock.seconds, "level_s": comm.seconds,
                            "level_bytes": comm.bytes, "wait_s": comm.wait_s, "calibration": cal})
        if ctx.rank == 0 and ctx.report is not None:
            ctx.report({"measured_step": k})  # the launcher's progress bar (k = 0: the warm-up)
    result["steps"] = records
    if check:
        ref_out, ref_grads = step.reference()
        b0, b1, c0, c1 = program.output_box(len(program.net.layers) - 1, ctx.rank)
        out_err = float((output - ref_out[b0:b1, c0:c1]).abs().max()) if output.numel() else 0.0
        grad_err, scale = gradient_error(grads, ref_grads)
        result.update(output_err=out_err, grad_err=grad_err, grad_scale=scale,
                      output_scale=float(ref_out.abs().max()))
    return result


def check_worker(ctx, programs: list, dtype_name: str = "float64") -> list:
    """Run one step of each program and return (output error, gradient error, gradient scale) for each."""
    import torch.distributed as dist

    out = []
    for program in programs:
        r = worker(ctx, program, dtype_name, steps=1, check=True, sync=False)
        out.append((r["output_err"], r["grad_err"], r["grad_scale"]))
        dist.barrier()
    return out
