import os
import platform
import threading

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


@pytest.mark.contract
def test_run_local_all_reduce_known_answer(processes):
    assert run_local(_sum_ranks, 3, timeout_s=30) == [3.0, 3.0, 3.0]


@pytest.mark.contract
def test_first_failure_kills_all_ranks_and_names_worker(processes):
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
def test_a_worker_that_exits_with_code_0_and_no_result_is_a_death_not_a_wait(processes, on_failure):
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


def test_a_worker_killed_mid_message_stops_only_its_own_messages(processes):
    """A multiprocessing queue's writers share one lock: rank 1 killed while writing held it for good, and
    rank 0's messages and result never reached the launcher (the job waited out its timeout)."""
    heard = []
    try:
        results = run_local(_killed_mid_message, 2, timeout_s=10, job_timeout_s=20, on_failure="continue",
                            on_message=lambda rank, message: heard.append((rank, message)))
    except WorkerError as exc:  # what the shared lock did: the job waited out its timeout
        raise AssertionError(f"rank 0's result never reached the launcher: {exc}") from None
    assert results[0] == "rank 0's result" and results[1] is None
    assert [m["after"] for rank, m in heard if rank == 0 and "after" in m] == [0, 1, 2, 3, 4]


WRITE_SYSCALL = {"x86_64": 1, "aarch64": 64}.get(platform.machine())


def _killed_mid_result(ctx, write_syscall):
    import os
    import signal
    import threading
    import time

    if ctx.rank == 0:
        time.sleep(1.0)  # its result goes out after rank 1's death
        return "rank 0's result"

    def kill_while_writing_the_result():  # SIGKILL this process while a thread of it is in a write() of 4 MB or more
        def writing() -> bool:
            for task in os.listdir("/proc/self/task"):
                try:
                    with open(f"/proc/self/task/{task}/syscall") as handle:
                        fields = handle.read().split()
                except OSError:
                    continue
                if fields and fields[0] == str(write_syscall) and int(fields[3], 16) >= 4 * 2**20:
                    return True
            return False
        while not writing():
            time.sleep(0.0002)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=kill_while_writing_the_result, daemon=True).start()
    return b"x" * (64 * 2**20)


@pytest.mark.skipif(WRITE_SYSCALL is None or not os.path.exists("/proc/self/task"),
                    reason="sees the write in /proc (Linux, x86_64 or aarch64)")
def test_a_worker_killed_while_its_result_is_written_is_a_death_not_a_hang(processes):
    """A result larger than a pipe's atomic write went down the pipe in pieces: the worker killed while
    the launcher read them (a write of its 64 MB result under way, seen in /proc) left part of it in
    the pipe, and the launcher's read waited for the rest for ever. Now the result is a file and the
    message its name: a kill during the file's write is a death; one the watcher misses leaves the
    whole result."""
    outcome = {}
    launcher = threading.Thread(target=lambda: outcome.setdefault("results", run_local(
        _killed_mid_result, 2, (WRITE_SYSCALL,), timeout_s=10, job_timeout_s=30, on_failure="continue")),
        daemon=True)
    launcher.start()
    launcher.join(40)  # a launcher that works returns in seconds; within the 60 s per-test timeout, so it fails here
    assert not launcher.is_alive(), "the launcher still waits, 40 s on: it read part of the killed worker's result"
    assert outcome["results"][0] == "rank 0's result"
    assert outcome["results"][1] in (None, b"x" * (64 * 2**20))


def test_a_result_goes_through_a_file_and_whole_through_the_queue_where_no_file_can_be_written(tmp_path):
    import multiprocessing
    import queue as queue_module

    from hetrain.jobs.mailboxes import MergedQueue, Spilled, post_result

    class Mailbox:
        def __init__(self):
            self.results = multiprocessing.get_context("spawn").Queue()

    box = Mailbox()
    merged = MergedQueue("results", [box])
    message = (1, "ok", b"y" * 100_000, None)
    post_result(box.results, message, str(tmp_path), "hetrain-w1")
    spilled = box.results.get(timeout=10)
    assert isinstance(spilled, Spilled) and os.path.getsize(spilled.path) > 100_000
    box.results.put(spilled)
    assert merged.get(timeout=10) == message
    assert os.listdir(tmp_path) == []  # read once, then removed
    error = (1, "error", "the barrier after the result failed", "traceback")  # "ok", then an error: both kept
    post_result(box.results, message, str(tmp_path), "hetrain-w1")
    post_result(box.results, error, str(tmp_path), "hetrain-w1")
    assert [merged.get(timeout=10), merged.get(timeout=10)] == [message, error]
    post_result(box.results, message, str(tmp_path / "no such folder"), "hetrain-w1")  # a full disk, say
    assert merged.get(timeout=10) == message
    with pytest.raises(queue_module.Empty):
        merged.get_nowait()
