import pytest
import torch
import torch.distributed as dist

from hetrain.errors import WorkerError
from hetrain.jobs.local_job import run_local


def _sum_ranks(ctx):
    t = torch.tensor([float(ctx.rank)])
    dist.all_reduce(t)
    return float(t.item())


def _fail_on_rank_1(ctx):
    if ctx.rank == 1:
        raise RuntimeError("injected failure")
    t = torch.zeros(1)
    dist.all_reduce(t)  # rank 1 never arrives: the others would hang without the launcher
    return 0


def test_run_local_all_reduce_known_answer():
    assert run_local(_sum_ranks, 3, timeout_s=30) == [3.0, 3.0, 3.0]


def test_first_failure_kills_all_ranks_and_names_worker():
    with pytest.raises(WorkerError, match="worker 1 failed") as info:
        run_local(_fail_on_rank_1, 3, timeout_s=30)
    assert "injected failure" in str(info.value)


def _exits_quietly(ctx):
    import os
    import time

    dist.barrier()  # connected: the exit is the only failure
    if ctx.rank == 1:
        os._exit(0)  # no result, exit code 0
    time.sleep(0.5)
    return ctx.rank


@pytest.mark.parametrize("on_failure", ["abort", pytest.param("continue", marks=pytest.mark.slow)])  # CI time
def test_a_worker_that_exits_with_code_0_and_no_result_is_a_death_not_a_wait(on_failure):
    """The launcher counted only non-zero exits as deaths and waited for ever for this worker's result."""
    if on_failure == "abort":
        with pytest.raises(WorkerError, match="worker 1 exited \\(code 0\\) without a result"):
            run_local(_exits_quietly, 2, timeout_s=20)
    else:
        assert run_local(_exits_quietly, 2, timeout_s=20, on_failure="continue") == [0, None]


def _killed_mid_message(ctx):
    import os
    import signal
    import threading
    import time

    if ctx.rank == 1:  # reports in a tight loop and is SIGKILLed meanwhile: most likely mid-message
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
        while True:
            ctx.report({"noise": "x" * 200})
    time.sleep(1.0)  # rank 0: its messages and result go out after rank 1's death
    for i in range(5):
        ctx.report({"after": i})
    return "rank 0's result"


def test_a_worker_killed_mid_message_stops_only_its_own_messages():
    """A multiprocessing queue's writers share one lock: rank 1 killed while writing held it for good, and
    rank 0's messages and result never reached the launcher (the job waited out its timeout)."""
    heard = []
    results = run_local(_killed_mid_message, 2, timeout_s=10, job_timeout_s=20, on_failure="continue",
                        on_message=lambda rank, message: heard.append((rank, message)))
    assert results[0] == "rank 0's result" and results[1] is None
    assert [m["after"] for rank, m in heard if rank == 0 and "after" in m] == [0, 1, 2, 3, 4]
