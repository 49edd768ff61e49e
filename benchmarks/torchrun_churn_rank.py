"""One rank of ``benchmarks/torchrun_churn_bench.py``'s torchrun job: ``hetrain train`` until the job's deadline.

    torchrun ... benchmarks/torchrun_churn_rank.py --protocol hop --workers 6 ... --out OUT   # no --time-budget, --log

A torchrun agent runs the same command line at each of its restarts, and a fresh agent (a node added
back) runs it too, so the time budget cannot be on it: this script reads the job's absolute deadline
(``HETRAIN_CHURN_DEADLINE``, ``time.time()`` seconds) and runs ``hetrain train ARGS --time-budget LEFT``,
LEFT = the deadline minus now, at least ``MIN_BUDGET_S`` (an attempt that starts after the deadline
still trains a moment, ends and writes its record). The budget counts training from the end of this
attempt's start-up, so an attempt ends its training about one start-up after the deadline. It adds
``--log none`` too (as Ray's churn job: no scalar logs): on torchrun's command line ``--log`` would
be refused as an ambiguous abbreviation of torchrun's ``--log-dir``/``--logs-specs``.

With ``HETRAIN_CHURN_EVENTS`` (a file) it appends one JSON line per event, for the benchmark's timings:
``start`` (this process runs), ``start`` also holds the checkpoint this rank is about to resume from (``checkpoint``: its file's
mtime, ``iteration`` and this rank's ``iterations`` computed in the attempt that wrote it; None
without a file), from which the benchmark counts the work the final model holds.
``training`` (its first iteration done: hetrain's ``first_iteration_at``
mark), ``exit`` (hetrain returned or raised; not seen for a SIGKILL) and ``sigterm`` (the agent
stopping it), each with the wall time, the rank, this pid, the agent's pid and torchrun's restart count.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import time

MIN_BUDGET_S = 1.0
AGENT_PID = os.getppid()  # torchrun's agent (read before anything else: it may die meanwhile)


def event(kind: str, **fields) -> None:
    path = os.environ.get("HETRAIN_CHURN_EVENTS")
    if not path:
        return
    record = {"event": kind, "t": time.time(), "rank": int(os.environ.get("RANK", -1)), "pid": os.getpid(),
              "agent": AGENT_PID, "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)), **fields}
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())  # one write of a short line: lines never interleave
    finally:
        os.close(fd)


def checkpoint_seen(argv: list[str]) -> dict | None:
    """This rank's checkpoint in ``--checkpoint-dir`` before this attempt runs (only this process writes it now)."""
    if "--checkpoint-dir" not in argv:
        return None
    directory = argv[argv.index("--checkpoint-dir") + 1]
    file = os.path.join(directory, f"worker-{os.environ['RANK']}.pt")
    try:
        import torch

        mtime = os.stat(file).st_mtime
        state = torch.load(file, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        return None
    except Exception as exc:  # hetrain refuses it too; the benchmark notes it (the rank must not fail here)
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}
    present = sum(os.path.exists(os.path.join(directory, f"worker-{r}.pt"))
                  for r in range(int(os.environ["WORLD_SIZE"])))
    return {"mtime": mtime, "iteration": int(state["protocol"]["iteration"]),
            "iterations": int(state["protocol"]["iterations"]), "files_present": present}


def _on_sigterm(signum, frame) -> None:
    event("sigterm")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _report_first_iteration() -> None:
    """Append a ``training`` event when hetrain marks this worker's first iteration."""
    from hetrain.jobs import phases

    mark = phases.PhaseClock.mark

    def marked(self, name: str) -> None:
        mark(self, name)
        if name == "first_iteration_at":
            event("training")

    phases.PhaseClock.mark = marked


def main(argv: list[str]) -> int:
    from hetrain.jobs.process_guard import die_with_parent

    die_with_parent(AGENT_PID)  # the node's loss kills its agent: its ranks go with it, also during imports
    seen = checkpoint_seen(argv)
    budget = max(MIN_BUDGET_S, float(os.environ["HETRAIN_CHURN_DEADLINE"]) - time.time())
    event("start", budget_s=round(budget, 3), master=f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}",
          checkpoint=seen)
    signal.signal(signal.SIGTERM, _on_sigterm)
    _report_first_iteration()
    from hetrain.cli import main as hetrain_main

    try:
        code = hetrain_main(["train", *argv, "--log", "none", "--time-budget", f"{budget:.3f}"])
    except BaseException as exc:
        event("exit", code=None, error=f"{type(exc).__name__}: {exc}"[:400])
        raise
    event("exit", code=code)
    return code


USAGE = ("usage: torchrun [torchrun's options] benchmarks/torchrun_churn_rank.py HETRAIN_TRAIN_ARGS\n\n"
         "One rank of benchmarks/torchrun_churn_bench.py's job (which sets HETRAIN_CHURN_DEADLINE).")

if __name__ == "__main__":
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(USAGE)
        sys.exit(0)
    if "HETRAIN_CHURN_DEADLINE" not in os.environ:
        sys.exit("torchrun_churn_rank.py: HETRAIN_CHURN_DEADLINE is not set (benchmarks/torchrun_churn_bench.py sets it)")
    code = main(sys.argv[1:])
    try:  # as hetrain's console_main: the exit handlers, then no interpreter teardown
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
