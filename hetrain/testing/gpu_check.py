"""The GPU check (``scripts/gpu-check``): named checks, each reported ok, FAILED or "not checked (why)".

Each check runs in a process of its own (``python -m hetrain.testing.gpu_check --one NAME``: a fresh
CUDA context, and a hang becomes a FAILED at the check's timeout). A check that cannot run here
(no CUDA, or fewer GPUs than it needs) is reported "not checked", never as passed. The exit code is 0
only when every *required* check ran and passed and no optional one failed (:func:`exit_code`);
with no CUDA device every check is "not checked" and the exit code is 1.

The checks themselves are in :mod:`hetrain.testing.gpu_checks`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

OK, FAILED, NOT_CHECKED = "ok", "FAILED", "not checked"
NOT_CHECKED_EXIT = 3  # a check's process exits with this when it cannot run here (its last line says why)


@dataclass(frozen=True)
class Check:
    name: str
    what: str  # one line: what passing shows
    required: bool = True
    gpus: int = 1  # GPUs it needs
    timeout_s: float = 300.0


@dataclass(frozen=True)
class Result:
    name: str
    status: str  # OK, FAILED or NOT_CHECKED
    detail: str
    required: bool
    seconds: float = 0.0


CHECKS = (
    Check("environment", "CUDA is available to this PyTorch", timeout_s=120),
    Check("staged-transfer-64mb", "64 MB payloads between 2 gloo ranks on GPU 0 through pinned staging, bit for "
                                  "bit, with matmuls on the default stream beside them"),
    Check("timing-excludes-other-streams", "a step's timer waits for the compute stream only: a second of work "
                                           "on another stream (a helper thread's) is not counted", timeout_s=120),
    Check("protocols-4-gloo-ranks", "every protocol trains with 4 gloo ranks sharing the GPU", timeout_s=600),
    Check("comm-memory-budget", "compressed Prague's copies stay within --comm-memory-mb, and a model that "
                                "cannot fit is refused in one line"),
    Check("compare-hop-allreduce-30s", "a 30 s hop vs allreduce comparison on the GPU, rank 0 3x slower",
          timeout_s=400),
    Check("nccl-preduce-2gpus", "a P-Reduce over NCCL between 2 ranks, 2 GPUs", required=False, gpus=2),
    Check("nccl-hop-payloads-2gpus", "Hop's payloads over NCCL (HETRAIN_DATA_PLANE=nccl), 2 GPUs",
          required=False, gpus=2),
    Check("nccl-comm-memory-2gpus", "compressed Prague over NCCL within --comm-memory-mb (GPU peak memory)",
          required=False, gpus=2),
)


def classify(returncode: int | None, last_line: str) -> tuple[str, str]:
    """(status, detail) of a check's process: exit 0 ok, NOT_CHECKED_EXIT not checked, anything else
    (None: killed at its timeout) FAILED."""
    if returncode == 0:
        return OK, last_line
    if returncode == NOT_CHECKED_EXIT:
        return NOT_CHECKED, last_line or "no reason given"
    if returncode is None:
        return FAILED, f"no result within its timeout ({last_line})" if last_line else "no result within its timeout"
    return FAILED, last_line or f"exit code {returncode}"


def exit_code(results: list[Result]) -> int:
    """0 when every required check passed and none failed; 1 otherwise (a required check not run counts)."""
    failed = any(r.status == FAILED for r in results)
    missing = any(r.required and r.status != OK for r in results)
    return 1 if failed or missing else 0


def table(results: list[Result]) -> str:
    """The results as a Markdown table (one row per check), and the verdict."""
    rows = ["| check | result | required | time | detail |", "|---|---|---|---|---|"]
    for r in results:
        status = r.status if r.status != NOT_CHECKED else f"not checked ({r.detail})"
        detail = "" if r.status == NOT_CHECKED else r.detail
        rows.append(f"| {r.name} | {status} | {'yes' if r.required else 'no'} | {r.seconds:.0f} s | "
                    f"{detail.replace('|', '/')[:160]} |")
    code = exit_code(results)
    verdict = "PASSED: every required check ran and passed" if code == 0 else \
        "NOT PASSED: " + ", ".join(f"{r.name} {r.status}" for r in results if r.status == FAILED or
                                   (r.required and r.status != OK))
    return "\n".join(rows + ["", verdict])


def run_all(checks, gpus: int, runner: Callable[[Check], tuple[str, str]]) -> list[Result]:
    """Each check through ``runner(check) -> (status, detail)``, unless this machine has fewer GPUs than it
    needs (``gpus``: 0 without CUDA): then "not checked" without running it."""
    results = []
    for check in checks:
        began = time.monotonic()
        if gpus < check.gpus:
            status, detail = NOT_CHECKED, "no CUDA device" if gpus == 0 else \
                f"needs {check.gpus} GPUs, this machine has {gpus}"
        else:
            print(f"== {check.name}: {check.what}", file=sys.stderr, flush=True)
            status, detail = runner(check)
        results.append(Result(check.name, status, detail, check.required, time.monotonic() - began))
    return results


def subprocess_runner(out: Path) -> Callable[[Check], tuple[str, str]]:
    """Runs a check as ``python -m hetrain.testing.gpu_check --one NAME``, its output in ``out/NAME.log``."""
    def run(check: Check) -> tuple[str, str]:
        log = out / f"{check.name}.log"
        command = [sys.executable, "-m", "hetrain.testing.gpu_check", "--one", check.name, "--out", str(out)]
        with open(log, "w") as handle:
            try:
                code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, timeout=check.timeout_s,
                                      env=os.environ.copy()).returncode
            except subprocess.TimeoutExpired:
                code = None
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
        return classify(code, lines[-1] if lines else "")
    return run


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run_one(name: str, out: Path) -> int:
    """The body of one check (in its own process): prints its one-line result last; the exit code says."""
    from hetrain.testing import gpu_checks

    try:
        print(getattr(gpu_checks, name.replace("-", "_"))(out), flush=True)
        return 0
    except gpu_checks.NotChecked as exc:
        print(str(exc), flush=True)
        return NOT_CHECKED_EXIT


def main(argv: list[str] | None = None, runner=None, gpus: int | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("GPU_CHECK_OUT", "runs/gpu-check"))
    parser.add_argument("--only", help="comma-separated check names (default: all)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.one:
        return run_one(args.one, out)
    checks = [c for c in CHECKS if not args.only or c.name in args.only.split(",")]
    results = run_all(checks, _gpus() if gpus is None else gpus, runner or subprocess_runner(out))
    report = table(results)
    (out / "summary.md").write_text(report + "\n")
    print(report)
    return exit_code(results)


if __name__ == "__main__":
    sys.exit(main())
