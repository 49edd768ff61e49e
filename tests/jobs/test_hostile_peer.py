"""A stranger on the ports of a local job and of a torchrun job: the Group Generator (hetrain's one
service in them) gets garbage, oversized lines, pickles that would create a marker file, requests
without a hello, and hellos with a made-up secret and with every value the job's store holds (torch's
store: anyone who reaches it may read it). The job ends as usual (exit 0, its figures), nobody got in,
and no pickle ran. (The Ray driver's ports: tests/ray/test_ray_hostile_peer.py.)"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hostile_peer import attack_lines, attack_store, listening_ports, send_raw, store_values

ROOT = Path(__file__).resolve().parents[2]
ITERATIONS = 1500


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _attack_while_it_runs(job: subprocess.Popen, gg_ports, marker, guesses=lambda: []) -> dict:
    """Attack the Group Generator once ``gg_ports()`` finds it; return {port: replies to each hello}."""
    attacked = {}
    deadline = time.monotonic() + 90
    while job.poll() is None and not attacked:
        assert time.monotonic() < deadline, "the job never opened its Group Generator"
        for port in gg_ports():
            attacked[port] = attack_lines(port, marker, guesses())
            send_raw(port, marker)
        time.sleep(0.1)
    return attacked


def _check(job: subprocess.Popen, attacked: dict, marker, out: Path, workers: int) -> None:
    output = job.communicate(timeout=120)[0]
    assert attacked, f"the job ended before the stranger found its Group Generator: {output[-2000:]}"
    for port, replies in attacked.items():
        assert replies and all(isinstance(r, dict) and "error" in r for r in replies), \
            f"a stranger got into the Group Generator on {port}: {replies}"
    assert not marker.exists(), "a stranger's pickle ran"
    assert job.returncode == 0, output[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["num_workers"] == workers and metrics["workers_lost"] == 0
    assert all(w["iterations"] >= ITERATIONS for w in metrics["workers"]), [w["iterations"] for w in metrics["workers"]]


@pytest.mark.timeout(150)
def test_a_stranger_on_a_local_jobs_group_generator_gets_nothing_in(processes, tmp_path):
    marker, out = tmp_path / "a-pickle-ran", tmp_path / "run"
    job = subprocess.Popen([sys.executable, "-m", "hetrain", "train", "--protocol", "prague", "--workers", "2",
                            "--iterations", str(ITERATIONS), "--no-progress", "--out", str(out)],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        # the launcher's own listening ports: its Group Generator (gloo's are the workers')
        attacked = _attack_while_it_runs(job, lambda: listening_ports({job.pid}), marker)
        _check(job, attacked, marker, out, 2)
    finally:
        job.kill()


@pytest.mark.timeout(150)
def test_a_stranger_who_reads_a_torchrun_jobs_store_gets_nothing_in(processes, tmp_path):
    marker, out, port = tmp_path / "a-pickle-ran", tmp_path / "run", _free_port()
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
                            "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "-m", "hetrain",
                            "train", "--protocol", "prague", "--iterations", str(ITERATIONS), "--out", str(out)],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env={k: v for k, v in dict(os.environ, OMP_NUM_THREADS="1").items()
                                if k != "HETRAIN_JOB_SECRET"})
    seen = {}

    def gg_ports():  # the stranger reads torchrun's stores (torch's: no authentication) for the GG's address
        seen.update(store_values(port))  # the rendezvous store names the job's store (MASTER_PORT)
        for master in {int(v) for k, v in seen.items() if k.endswith("MASTER_PORT")}:
            seen.update(store_values(master))
        return [int(v.decode().rsplit(":", 1)[1]) for k, v in seen.items() if k.endswith("gg_address")]

    try:
        attacked = _attack_while_it_runs(job, gg_ports, marker,
                                         lambda: [v.decode(errors="replace") for v in seen.values()])
        attack_store(port, marker, "hetrain/messages")  # a queue nobody reads: nothing there is unpickled
        _check(job, attacked, marker, out, 2)
    finally:
        job.kill()
