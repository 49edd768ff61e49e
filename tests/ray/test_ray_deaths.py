"""A Ray job's other ways to lose a worker: one actor killed (a user's own loop, ``hetrain.ray.run``), an
actor that hangs (found by heartbeat), and the driver itself (no actor may outlive it)."""

import os
import signal
import subprocess
import time

import psutil
import pytest
from ray_nodes import train_command  # noqa: E402 (tests/ray is on sys.path)

pytest.importorskip("ray", reason="the Ray launcher's tests need hetrain[ray]")

import ray_probe  # noqa: E402 (on the actors' PYTHONPATH too: tests/ray/conftest.py)
import torch  # noqa: E402

import hetrain.ray  # noqa: E402
from hetrain.config import RunConfig  # noqa: E402
from hetrain.ray.training import run_training_ray  # noqa: E402


class KillRank:
    """SIGKILLs ``rank``'s actor process once it has reported ``at_iteration``."""

    def __init__(self, rank: int, at_iteration: int):
        self.rank, self.at_iteration = rank, at_iteration
        self.pid = None
        self.killed = False

    def __call__(self, rank: int, message: dict) -> None:
        if rank == self.rank and "pid" in message:
            self.pid = message["pid"]
        if rank == self.rank and not self.killed and message.get("iteration", 0) >= self.at_iteration:
            os.kill(self.pid, signal.SIGKILL)
            self.killed = True


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_users_own_loop_survives_a_killed_actor(processes, joined):
    joined(3)
    kill = KillRank(1, at_iteration=30)
    results = hetrain.ray.run(ray_probe.hook_form_hop, 3, args=(3000,), on_failure="continue", on_message=kill)
    assert kill.killed and results[1] is None
    assert [d["rank"] for d in results.deaths] == [1]
    survivors = [results[0], results[2]]
    if survivors[0]["name"] is not None:  # named as local workers are, not as Ray's worker process
        assert [r["name"] for r in survivors] == ["hetrain-w0", "hetrain-w2"]
    assert max(r["steps"] for r in survivors) >= 3000 and min(r["steps"] for r in survivors) > 30, \
        [r["steps"] for r in survivors]  # trained on past the death (Hop stops on the job's iteration)
    # each pulled towards its own target (0, 2): only the final average makes their weights one
    assert torch.allclose(torch.tensor(survivors[0]["weights"]), torch.tensor(survivors[1]["weights"]), atol=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_stopped_actor_is_found_hung_by_heartbeat_and_the_job_goes_on(processes, joined):
    joined(3)
    config = RunConfig(protocol="hop", num_workers=3, compute_ms=20.0, time_budget_s=10.0, timeout_s=30.0,
                       fail="1@2s:stop", heartbeat_timeout_s=3.0, on_failure="continue")
    metrics = run_training_ray(config, None, None, {"CPU": 1}, progress=False)
    assert metrics["workers_lost"] == 1
    death = metrics["deaths"][0]
    assert death["rank"] == 1 and death["cause"] == "hung", death
    assert "no heartbeat" in death["how"]
    assert metrics["final_accuracy_avg_model"] > 0.8


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_an_actor_stopped_before_its_first_heartbeat_is_found_hung_too(processes, joined):
    """Its silence counted from its first beat, so an actor stopped in start-up was never found hung and
    its neighbour failed the job at --timeout ("could not reach its neighbour 1"), continue or not."""
    joined(2)
    config = RunConfig(protocol="hop", num_workers=2, compute_ms=20.0, time_budget_s=3.0, timeout_s=30.0,
                       fail="1@startup:stop", heartbeat_timeout_s=3.0, on_failure="continue")
    metrics = run_training_ray(config, None, None, {"CPU": 1}, progress=False)
    assert [(d["rank"], d["cause"]) for d in metrics["deaths"]] == [(1, "hung")]


def _actor_processes() -> list[psutil.Process]:
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.cmdline() and "WorkerActor" in proc.cmdline()[0]:
                found.append(proc)
        except psutil.Error:
            pass
    return found


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_killed_driver_leaves_no_actor_behind(processes, make_cluster, tmp_path):
    cluster = make_cluster(2)
    driver = subprocess.Popen(
        train_command(cluster.address, tmp_path, "--time-budget", "60", "--no-progress"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while len(_actor_processes()) < 2:
            assert driver.poll() is None and time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.5)
        time.sleep(2.0)
    finally:
        driver.kill()
        driver.wait(timeout=30)
    deadline = time.monotonic() + 60
    while _actor_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _actor_processes(), "actors outlived their driver"


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_abort_fails_the_cli_in_one_line_naming_the_killed_actor(processes, make_cluster, tmp_path):
    cluster = make_cluster(2)
    done = subprocess.run(
        train_command(cluster.address, tmp_path, "--compute-ms", "50", "--time-budget", "20", "--on-failure",
                      "abort", "--fail", "1@2s", "--no-progress"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("hetrain:")]
    assert len(lines) == 1 and lines[0].startswith("hetrain: job failed: worker 1 was killed by --fail 1@2s"), lines
    assert not (tmp_path / "metrics.json").exists()
    assert "worker 1 was killed by --fail 1@2s" in (tmp_path / "errors.log").read_text()
