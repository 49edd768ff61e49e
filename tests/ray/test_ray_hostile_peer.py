"""A stranger on a Ray job's driver: every port the driver process listens on (its store, the Group
Generator it serves, Ray's own) gets garbage, oversized frames and pickles that would create a marker
file; the store's report queue gets pickles and replays of real reports. The job ends as usual (exit 0,
its figures) and no pickle ran. (The issue this guards: the driver unpickled what it popped from its
store, so a stranger who found the port ran code as the driver's user.)"""

import json
import os
import subprocess
import time

import pytest
from hostile_peer import attack_lines, attack_store, listening_ports, send_raw, store_values
from ray_nodes import train_command  # noqa: E402 (tests/ray is on sys.path)

from hetrain.ray.channels import MESSAGES_KEY

pytest.importorskip("ray", reason="the Ray launcher's tests need hetrain[ray]")


@pytest.mark.timeout(170)
def test_a_stranger_on_the_drivers_ports_runs_no_code_and_the_job_ends_as_usual(processes, make_cluster, tmp_path):
    cluster = make_cluster(2)
    marker = tmp_path / "a-pickle-ran"
    driver = subprocess.Popen(
        train_command(cluster.address, tmp_path / "out", "--protocol", "prague", "--iterations", "3000",
                      "--no-progress"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    attacked, stores, services, read = set(), [], {}, {}
    try:
        deadline = time.monotonic() + 120
        while driver.poll() is None and not (stores and services):
            assert time.monotonic() < deadline, "the driver never opened its store and Group Generator"
            fresh = sorted(listening_ports({driver.pid}) - attacked)
            for port in fresh:  # a service of JSON lines that refuses a made-up secret is the Group Generator
                replies = attack_lines(port, marker, timeout_s=5)
                if isinstance(replies[0], dict):
                    services[port] = replies
                elif values := store_values(port):  # anyone may read it: every value becomes a guess of the secret
                    read.update(values)
                    stores.append(port)
                    attack_store(port, marker, MESSAGES_KEY)
            guesses = [v.decode(errors="replace") for v in read.values() if len(v) < 200]
            for port in services:
                services[port] = services[port][:1] + attack_lines(port, marker, guesses)
            for port in fresh:
                send_raw(port, marker)
                attacked.add(port)
            time.sleep(0.2)
        _, err = driver.communicate(timeout=150)
    finally:
        driver.kill()
    assert stores, f"no store among the driver's ports {sorted(attacked)} (it ended: {err[-2000:]})"
    assert services, f"no Group Generator among the driver's ports {sorted(attacked)} (exit {driver.returncode}: " \
                     f"{err[-3000:]})"
    for port, replies in services.items():
        assert all(isinstance(r, dict) and "error" in r for r in replies), f"a stranger got in on {port}: {replies}"
    assert not marker.exists(), "a stranger's pickle ran on the driver"
    assert driver.returncode == 0, err[-3000:]
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["workers_lost"] == 0
    assert all(w["iterations"] >= 3000 for w in metrics["workers"]), [w["iterations"] for w in metrics["workers"]]
    assert metrics["final_accuracy_avg_model"] > 0.8
