"""Start-up: workers start warm, import only what they use, and every phase of a job is timed."""

import os
import subprocess
import sys
import time

import pytest
import torch
from worker_probe import train_then_list_modules

from hetrain.config import RunConfig
from hetrain.data import load_dataset
from hetrain.errors import UsageError
from hetrain.jobs import run_local
from hetrain.jobs.phases import WORKER_PHASES
from hetrain.jobs.run import run_training
from hetrain.jobs.train_worker import CALIBRATION_BUDGET_S, CALIBRATION_ITERATIONS, measure_math_s
from hetrain.jobs.warm_start import START_METHOD_ENV, start_method

SHORT = dict(num_workers=2, compute_ms=20.0, time_budget_s=1.0, timeout_s=30.0)


@pytest.mark.contract
def test_a_worker_imports_neither_scikit_learn_nor_matplotlib(processes):
    config = RunConfig(protocol="hop", **SHORT)
    data = load_dataset(config.workload, config.seed)  # the launcher's copy, as run_training hands it over
    results = run_local(train_then_list_modules, 2, (config, {}, data), timeout_s=30)
    for rank, result in enumerate(results):
        assert result["result"]["worker"]["iterations"] > 0
        assert result["modules"] == [], f"worker {rank} imported {result['modules']}"


def test_the_warm_server_module_leaves_one_thread_and_no_cuda_or_process_group(processes):
    """What the server imports before it forks must leave it single-threaded (fork copies no other
    thread, so a lock another thread held would stay held in every worker) and without CUDA or gloo."""
    code = ("import os, sys; import hetrain.jobs.warm; import torch, torch.distributed as dist; "
            "print(len(os.listdir('/proc/self/task')), torch.cuda.is_initialized(), dist.is_initialized(), "
            "sorted({m.split('.')[0] for m in sys.modules} & {'sklearn', 'matplotlib'}))")
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split(None, 3) == ["1", "False", "False", "[]\n"], out.stdout


@pytest.mark.parametrize("protocol", ["hop", "allreduce"])
def test_the_phases_of_a_run_add_up(processes, protocol):
    metrics = run_training(RunConfig(protocol=protocol, **SHORT), None, progress=False)
    workers = metrics["workers"]
    for w in workers:
        assert all(w[phase] >= 0 for phase in WORKER_PHASES), w
        assert w["first_iteration_s"] > 0
    slowest = max(workers, key=lambda w: w["first_iteration_s"])
    assert metrics["startup_slowest_worker"]["rank"] == slowest["rank"]
    # launch -> every worker's first iteration covers the slowest starter's import, set-up and connection
    assert metrics["startup_s"] == slowest["first_iteration_s"]
    assert metrics["startup_s"] >= sum(slowest[p] for p in ("import_s", "setup_s", "connect_s"))
    # and none of it is training: the loop's own clock starts after the phases
    assert metrics["finish_s_max_worker"] == max(w["finish_s"] for w in workers) > 0
    assert metrics["teardown_s"] > 0


def test_start_method_is_forkserver_unless_asked_otherwise(monkeypatch):
    monkeypatch.delenv(START_METHOD_ENV, raising=False)
    assert start_method() == ("forkserver" if sys.platform != "win32" else "spawn")
    monkeypatch.setenv(START_METHOD_ENV, "spawn")
    assert start_method() == "spawn"
    monkeypatch.setenv(START_METHOD_ENV, "fork")
    with pytest.raises(UsageError, match="forkserver or spawn"):
        start_method()


def test_a_temp_dir_too_long_for_the_servers_socket_falls_back_to_spawn_saying_so(monkeypatch, capsys):
    """Linux takes an AF_UNIX path of at most 107 bytes; the forkserver's is the temp dir + 32. Past
    that, multiprocessing's forkserver fails at start-up with a traceback ("AF_UNIX path too long")."""
    import tempfile

    from hetrain.jobs import warm_start

    monkeypatch.delenv(START_METHOD_ENV, raising=False)
    monkeypatch.setattr(warm_start, "_warned_long_tempdir", False)
    fits = "/tmp/" + "x" * (warm_start.SOCKET_PATH_MAX - warm_start.SOCKET_SUFFIX_LEN - len("/tmp/"))
    monkeypatch.setattr(tempfile, "gettempdir", lambda: fits)
    assert start_method() == ("forkserver" if sys.platform != "win32" else "spawn")
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(tempfile, "gettempdir", lambda: fits + "x")
    assert start_method() == "spawn"
    warning = capsys.readouterr().err
    assert "too long for the warm server's socket" in warning and "TMPDIR" in warning
    assert len(warning.splitlines()) == 1
    start_method()
    assert capsys.readouterr().err == "", "the warning is given once"


def _environment_variable(ctx, name):
    return os.environ.get(name)


def test_a_worker_sees_the_launchers_environment_at_its_start_not_the_servers(processes, monkeypatch):
    run_local(_environment_variable, 1, ("HETRAIN_TEST_VALUE",), timeout_s=30)  # the server runs by now
    monkeypatch.setenv("HETRAIN_TEST_VALUE", "set after the server started")
    assert run_local(_environment_variable, 2, ("HETRAIN_TEST_VALUE",), timeout_s=30) == [
        "set after the server started"] * 2


class _CountingSampler:
    def __init__(self):
        self.batches = 0

    def next(self):
        self.batches += 1
        return torch.zeros(4, 64), torch.zeros(4, dtype=torch.long)


class _SlowModel(torch.nn.Module):
    def __init__(self, seconds):
        super().__init__()
        self.linear = torch.nn.Linear(64, 10)
        self.seconds = seconds

    def forward(self, x):
        time.sleep(self.seconds)
        return self.linear(x)


# the fast model's budget is ample: a stall of the test's own thread on a busy machine must not use it up
@pytest.mark.parametrize("step_s, budget_s, passes", [(0.0, 30.0, 1 + CALIBRATION_ITERATIONS),
                                                      (0.3, CALIBRATION_BUDGET_S, 2)])
def test_calibration_costs_at_most_a_few_iterations(step_s, budget_s, passes):
    """A fast model is timed CALIBRATION_ITERATIONS times after a warm-up; one slower than the
    calibration budget only once (the LM on busy cores takes seconds a step)."""
    assert CALIBRATION_BUDGET_S < 0.3
    sampler = _CountingSampler()
    model = _SlowModel(step_s)
    math_s = measure_math_s(model, sampler, budget_s=budget_s)
    assert sampler.batches == passes
    assert math_s >= step_s
    assert all(p.grad is None for p in model.parameters())  # calibration leaves no gradient behind
