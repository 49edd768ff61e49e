"""`hetrain profile` (measured and from Metis files) and `hetrain plan --measure`, end to end."""

import json

import pytest

from hetrain.cli import main
from hetrain.planner.devices import parse_array


@pytest.mark.timeout(120)
def test_profile_writes_a_device_file_the_planner_reads(processes, tmp_path, capsys):
    out = tmp_path / "cpu.yaml"
    assert main(["profile", "--workers", "2", "--seconds", "0.2", "--out", str(out)]) == 0
    assert "GFLOP/s" in capsys.readouterr().out
    devs = parse_array(str(out))
    assert [d.kind for d in devs] == ["cpu", "cpu"]
    assert devs[0].flops_per_s > 1e8 and devs[0].link_bytes_per_s > 1e6 and devs[0].memory_bytes > 2**20


METIS_CLUSTER = {
    "10.0.0.1": {"instance_type": "A100", "inter_bandwidth": 312500000.0, "intra_bandwidth": 5312500000.0,
                 "memory": 80},
    "10.0.0.2": {"instance_type": "T4", "inter_bandwidth": 312500000.0, "intra_bandwidth": 5312500000.0,
                 "memory": 15},
}


def _metis_profile(ms):
    return {"model": {"model_name": "GPT3", "num_layers": 10, "parameters": {"total_parameters_bytes": 1,
                                                                            "parameters_per_layer_bytes": [1]}},
            "execution_time": {"total_time_ms": ms, "forward_backward_time_ms": ms, "batch_generator_time_ms": 0,
                               "layernorm_grads_all_reduce_time_ms": 0, "embedding_grads_all_reduce_time_ms": 0,
                               "optimizer_time_ms": 1, "layer_compute_total_ms": [ms]},
            "execution_memory": {"total_memory_mb": 1, "layer_memory_total_mb": [1]}}


def test_metis_files_become_a_device_file(tmp_path, capsys):
    cluster, hosts, profiles = tmp_path / "cluster.json", tmp_path / "hostfile", tmp_path / "profiles"
    cluster.write_text(json.dumps(METIS_CLUSTER))
    hosts.write_text("10.0.0.1 4\n10.0.0.2 4\n")
    profiles.mkdir()
    (profiles / "DeviceType.A100_tp1_bs1.json").write_text(json.dumps(_metis_profile(10.0)))
    (profiles / "DeviceType.T4_tp1_bs1.json").write_text(json.dumps(_metis_profile(80.0)))
    out = tmp_path / "devs.json"
    assert main(["profile", "--metis-cluster", str(cluster), "--metis-hostfile", str(hosts), "--metis-profiles",
                 str(profiles), "--out", str(out)]) == 0
    devs = parse_array(str(out))
    a100, t4 = devs[0], devs[-1]
    assert [d.kind for d in devs] == ["a100"] * 4 + ["t4"] * 4
    assert t4.flops_per_s == pytest.approx(a100.flops_per_s / 8)  # 8x slower in the same profile setting
    assert t4.link_bytes_per_s == pytest.approx(5.3125e9) and t4.memory_bytes == pytest.approx(15e9)
    # without profiles the T4 cannot be placed: one line, exit 2
    assert main(["profile", "--metis-cluster", str(cluster), "--out", str(out)]) == 2
    assert "'t4' is not in the catalog" in capsys.readouterr().err


@pytest.mark.timeout(240)
def test_plan_measure_runs_the_plan(processes, tmp_path, capsys):
    devs = tmp_path / "cpu.yaml"
    devs.write_text("devices:\n  cpu: {tflops: 0.02, memory_gib: 4, link_gb_per_s: 1}\narray: cpu:2\n")
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "mlp", "--batch", "16", "--devices", str(devs), "--measure", "--steps", "1",
                 "--calibrate-s", "0.2", "--json", str(out), "--table"]) == 0
    text = capsys.readouterr().out
    assert "predicted ms" in text and "level 0 communication" in text and "ok" in text
    m = json.loads(out.read_text())["measure"]
    assert m["processes"] == 2 and m["check"]["ok"]
    assert m["measured"]["step_s"] > 0 and m["predicted_calibrated"]["step_s"] > 0
    # the bytes the executor moved are the bytes the cost model counts
    assert m["measured"]["level_bytes"][0] == pytest.approx(m["predicted"]["level_bytes"][0], rel=1e-6)


def test_measure_rejects_attention_models_before_starting(tmp_path, capsys):
    devs = tmp_path / "cpu.yaml"
    devs.write_text("devices:\n  cpu: {tflops: 0.02, memory_gib: 64, link_gb_per_s: 1}\narray: cpu:2\n")
    assert main(["plan", "--model", "transformer", "--batch", "2", "--devices", str(devs), "--measure"]) == 2
    assert "sequences" in capsys.readouterr().err
