"""``hetrain train --launcher ray`` on a one-node Ray cluster: the job runs, writes its record, listens on
loopback only. (Deaths and replacements on several nodes: test_ray_failures.py, in the slow set.)"""

import json
import os
import re
import signal
import subprocess
import threading
import time

import psutil
import pytest
from ray_nodes import train_command  # noqa: E402 (tests/ray is on sys.path)

pytest.importorskip("ray", reason="the Ray launcher's tests need hetrain[ray]")


def _listening_beyond_loopback(stop: threading.Event, found: list) -> None:
    """Until ``stop``: every socket a process of this test's tree listens on that is not on loopback."""
    me = psutil.Process()
    while not stop.wait(0.5):
        pids = {p.pid for p in me.children(recursive=True)}
        for conn in psutil.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
                ip = conn.laddr.ip.removeprefix("::ffff:")
                if ip not in ("127.0.0.1", "::1"):
                    found.append((ip, conn.laddr.port, conn.pid))


@pytest.mark.timeout(180)  # 8-14 s idle, 15-29 s beside two CPU burners (110-126 s at Ray's niceness 15)
@pytest.mark.contract
def test_a_hop_job_on_ray_actors_trains_and_writes_its_record(processes, make_cluster, tmp_path):
    cluster = make_cluster(2)
    stop, beyond = threading.Event(), []
    watcher = threading.Thread(target=_listening_beyond_loopback, args=(stop, beyond), daemon=True)
    watcher.start()
    try:
        done = subprocess.run(
            train_command(cluster.address, tmp_path, "--protocol", "hop", "--iterations", "150", "--no-progress"),
            capture_output=True, text=True, timeout=150, env=dict(os.environ))
    finally:
        stop.set()
        watcher.join()
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["launcher"] == "ray"
    assert sorted(metrics["ray_placements"]) == ["0.0", "1.0"]  # each rank's actor, first incarnation
    # at the normal CPU priority, not Ray's niceness 15 for its workers (74 s, not 4 s, to import torch
    # beside two CPU burners)
    assert [p["niceness"] for p in metrics["ray_placements"].values()] == [0, 0]
    assert all(w["iterations"] > 100 for w in metrics["workers"])  # both trained (hop stops on the job's iteration)
    assert metrics["final_accuracy_avg_model"] > 0.8
    assert metrics["workers_lost"] == 0
    assert not beyond, f"listening beyond loopback: {beyond}"


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_ctrl_c_stops_the_actors_and_writes_what_the_run_had(processes, make_cluster, tmp_path):
    cluster = make_cluster(2)
    driver = subprocess.Popen(
        train_command(cluster.address, tmp_path, "--compute-ms", "50", "--time-budget", "60"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    err = bytearray()
    reader = threading.Thread(target=lambda: [err.extend(c) for c in iter(lambda: os.read(driver.stderr.fileno(),
                                                                                         4096), b"")], daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 90
        while not re.search(rb"[1-9]\d* gradients", err):  # the progress bar: training is under way
            assert driver.poll() is None and time.monotonic() < deadline, err.decode(errors="replace")[-3000:]
            time.sleep(0.2)
        began = time.monotonic()
        driver.send_signal(signal.SIGINT)
        assert driver.wait(timeout=60) == 130, err.decode(errors="replace")[-3000:]
        assert time.monotonic() - began < 30
    finally:
        driver.kill()
        driver.wait(timeout=30)
        reader.join(timeout=5)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["interrupted"] is True and metrics["launcher"] == "ray"
    assert 0 < metrics["wall_time_s"] < 50 and metrics["total_iterations"] > 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_cluster_too_small_for_the_job_fails_it_in_one_line_and_leaves_nothing(processes, joined):
    import ray

    from hetrain.errors import WorkerError
    from hetrain.ray.actors import RayPlacement
    from hetrain.ray.job import run_ray

    joined(2)
    placement = RayPlacement({"CPU": 1.0}, "127.0.0.1", {}, placement_timeout_s=3.0)
    with pytest.raises(WorkerError, match=r"could not place 4 workers of \{'CPU': 1.0\} within 3 s"):
        run_ray(len, 4, placement=placement)
    assert ray.util.placement_group_table() and all(
        group["state"] == "REMOVED" for group in ray.util.placement_group_table().values())
