"""Inputs the planner must refuse in one line (exit 2, nothing written) or read correctly (review of 2026-12-05).

Each test names the defect it guards: weighted layers left out of the plan, convolution geometry
guessed by the executor, non-finite device figures, ShapeProp's traceback, capitalised device
kinds, unchecked Metis files and measurements, unbounded device counts, float64 modules, and the
documentation/table slips.
"""

import inspect
import json
import math
import re

import pytest
import torch
from torch import nn

from hetrain.cli import main
from hetrain.errors import UsageError
from hetrain.planner import api
from hetrain.planner.devices import parse_array
from hetrain.planner.trace import trace


def _one_line_error(capsys, needle):
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hetrain: error:") and needle in err, err
    return err


def _module_file(tmp_path, body, name="Net"):
    mod = tmp_path / "mynet.py"
    mod.write_text("import torch\nfrom torch import nn\nimport torch.nn.functional as F\n"
                   f"class {name}(nn.Module):\n" + body)
    return f"module:{mod}:{name}"


# ---- 1. weighted layers other than Linear/Conv2d are refused, naming them; norm layers stay free -------------

CONV1D = ("    def __init__(self):\n        super().__init__(); self.c = nn.Conv1d(4, 16, 3); self.l = nn.Linear(16 * 14, 10)\n"
          "    def forward(self, x):\n        return self.l(torch.flatten(F.relu(self.c(x)), 1))\n")
EMBED = ("    def __init__(self):\n        super().__init__(); self.e = nn.Embedding(100, 8); self.l = nn.Linear(8, 10)\n"
         "    def forward(self, x):\n        return self.l(self.e(x.long()).mean(1))\n")
DIRECT = ("    def __init__(self):\n        super().__init__(); self.w = nn.Parameter(torch.randn(8, 8))\n"
          "        self.l = nn.Linear(8, 10)\n"
          "    def forward(self, x):\n        return self.l(x @ self.w.t())\n")


@pytest.mark.parametrize("body,shape,needle", [(CONV1D, "4,16", "layer c (Conv1d)"),
                                               (EMBED, "16", "layer e (Embedding)"),
                                               (DIRECT, "8", "parameter w")])
def test_weighted_layers_the_planner_cannot_split_are_refused(tmp_path, capsys, body, shape, needle):
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", _module_file(tmp_path, body), "--input-shape", shape, "--batch", "8",
                 "--devices", "a100:2", "--json", str(out)]) == 2
    _one_line_error(capsys, needle)
    assert not out.exists()


def test_norm_layers_stay_free_and_counted():
    class Normed(nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
            self.ln, self.gn, self.act = nn.LayerNorm(8 * 8 * 8), nn.GroupNorm(2, 8), nn.PReLU()
            self.l = nn.Linear(8 * 8 * 8, 10)

        def forward(self, x):
            return self.l(self.ln(torch.flatten(self.act(self.gn(self.bn(self.c(x)))), 1)))

    module = Normed()
    net = trace(module, (3, 8, 8), "normed")
    assert [la.name for la in net.layers] == ["c", "l"]
    assert net.total_params == sum(p.numel() for p in module.parameters())


# ---- 2. the executor uses the traced stride and padding, not a guess ---------------------------------------

class _Strided(nn.Module):
    def __init__(self, dilation=1):
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3, stride=2, dilation=dilation)
        side = 3 if dilation == 1 else 2
        self.l = nn.Linear(8 * side * side, 10)

    def forward(self, x):
        return self.l(torch.flatten(torch.relu(self.c(x)), 1))


def test_executor_uses_the_traced_conv_geometry():
    from hetrain.planner.program import Program
    from hetrain.planner.train_step import reference_step
    from hetrain.planner.train_worker import executor_layout

    torch.manual_seed(0)
    module = _Strided()
    net = trace(module, (3, 7, 7), "strided")
    assert (net.layers[0].stride, net.layers[0].padding, net.layers[0].dilation) == ((2, 2), (0, 0), (1, 1))
    plan = api.compare_plans(net, 8, api.devices("a100:2"), dtype_bytes=4.0).plans["plan"]
    program = Program(net, 8, plan)
    assert program.conv[0] == (3, 2, 0)  # sizes alone (7x7 -> 3x3) would give stride 3, padding 1
    module = module.double()
    w, b = executor_layout(torch, module, net)
    x, y = torch.randn(8, 3, 7, 7, dtype=torch.float64), torch.randint(0, 10, (8,))
    loss, _, _ = reference_step(program, torch, w, b, x, y)
    with torch.no_grad():
        expected = float(nn.functional.cross_entropy(module(x), y))
    assert loss == pytest.approx(expected, rel=1e-12)


def test_executor_refuses_dilated_convolutions():
    from hetrain.planner.program import Program

    net = trace(_Strided(dilation=2), (3, 7, 7), "dilated")
    assert net.layers[0].dilation == (2, 2)
    plan = api.compare_plans(net, 8, api.devices("a100:2"), dtype_bytes=4.0).plans["plan"]
    with pytest.raises(UsageError, match="dilated convolution"):
        Program(net, 8, plan)


# ---- 3. device figures must be finite, also once scaled ------------------------------------------------------

@pytest.mark.parametrize("spec,needle", [
    ("{tflops: .inf, memory_gib: 48, link_gb_per_s: 100}", "tflops must be a finite positive number"),
    ("{tflops: 1.0e+300, memory_gib: 48, link_gb_per_s: 100}", "out of range once converted"),
    ("{tflops: 200, memory_gib: .inf, link_gb_per_s: 100}", "memory_gib must be a finite positive number"),
    ("{tflops: 200, memory_gib: 48, link_gb_per_s: 100, link_latency_us: .inf}", "link_latency_us must be"),
])
def test_device_figures_must_be_finite(tmp_path, capsys, spec, needle):
    path = tmp_path / "devs.yaml"
    path.write_text(f"devices:\n  npu: {spec}\narray: npu:2,a100:2\n")
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "mlp", "--batch", "8", "--devices", str(path), "--json", str(out)]) == 2
    _one_line_error(capsys, needle)
    assert not out.exists()


# ---- 4. a wrong --input-shape is one line, with the model's own error ------------------------------------------

def test_wrong_input_shape_is_one_line_with_the_cause(tmp_path, capsys):
    spec = _module_file(tmp_path, "    def __init__(self):\n        super().__init__(); self.a = nn.Linear(8, 4)\n"
                                  "    def forward(self, x):\n        return self.a(x)\n")
    assert main(["plan", "--model", spec, "--input-shape", "5", "--batch", "8", "--devices", "a100:2"]) == 2
    err = _one_line_error(capsys, "input shape (5,)")
    assert "ShapeProp error" not in err and "same reduction dim" in err


# ---- 5. device kinds with capitals --------------------------------------------------------------------------

def test_device_kinds_with_capitals_are_usable(tmp_path, capsys):
    path = tmp_path / "devs.yaml"
    path.write_text("devices:\n  MyNPU: {tflops: 200, memory_gib: 48, link_gb_per_s: 100}\narray: MyNPU:2,a100:2\n")
    assert [d.kind for d in parse_array(str(path))] == ["mynpu", "mynpu", "a100", "a100"]
    assert main(["plan", "--model", "mlp", "--batch", "8", "--devices", str(path)]) == 0
    assert "mynpu:2,a100:2" in capsys.readouterr().out
    path.write_text("devices:\n  NPU: {tflops: 2, memory_gib: 4, link_gb_per_s: 1}\n"
                    "  npu: {tflops: 3, memory_gib: 4, link_gb_per_s: 1}\narray: npu:2\n")
    assert main(["plan", "--model", "mlp", "--batch", "8", "--devices", str(path)]) == 2
    _one_line_error(capsys, "described twice")


# ---- 6. Metis cluster files are validated; differing hosts of one type stay apart --------------------------------

@pytest.mark.parametrize("memory,needle", [('"lots"', "memory must be a finite positive number"),
                                           ("0", "memory must be a finite positive number"),
                                           ("-3", "memory must be a finite positive number"),
                                           ("1e999", "memory must be a finite positive number")])
def test_metis_cluster_figures_are_checked(tmp_path, capsys, memory, needle):
    cluster = tmp_path / "c.json"
    cluster.write_text('{"h1": {"instance_type": "A100", "inter_bandwidth": 1e9, "intra_bandwidth": 3e11, '
                       f'"memory": {memory}}}}}')
    out = tmp_path / "devs.yaml"
    assert main(["profile", "--metis-cluster", str(cluster), "--out", str(out)]) == 2
    _one_line_error(capsys, needle)
    assert not out.exists()


def test_metis_hosts_of_one_type_with_different_figures_get_distinct_kinds(tmp_path, capsys):
    host = {"instance_type": "A100", "inter_bandwidth": 1e9, "intra_bandwidth": 3e11}
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({"h1": {**host, "memory": 80}, "h2": {**host, "memory": 40},
                                   "h3": {**host, "memory": 80}}))
    out = tmp_path / "devs.yaml"
    assert main(["profile", "--metis-cluster", str(cluster), "--out", str(out)]) == 0
    devs = parse_array(str(out))
    assert [d.kind for d in devs] == ["a100", "a100-2", "a100"]
    assert [round(d.memory_bytes / 1e9) for d in devs] == [80, 40, 80]


# ---- 7. hetrain profile: --seconds finite and positive; no file from a zero measurement ------------------------

def _fake_measurement(monkeypatch, **figures):
    """Stand in for the measuring processes: every worker reports these figures."""
    import hetrain.jobs

    def fake_run_local(fn, world, args, **kwargs):
        return [{"flops_per_s": 2e10, "recv_bytes_per_s": 1e9, "round_s": 1e-4, **figures} for _ in range(world)]

    monkeypatch.setattr(hetrain.jobs, "run_local", fake_run_local)


@pytest.mark.parametrize("seconds", ["nan", "inf", "0", "-1"])
def test_profile_seconds_must_be_finite_and_positive(tmp_path, capsys, monkeypatch, seconds):
    _fake_measurement(monkeypatch)  # nothing is measured for real, whatever happens
    out = tmp_path / "cpu.yaml"
    assert main(["profile", "--seconds", seconds, "--out", str(out)]) == 2
    _one_line_error(capsys, "--seconds must be a finite positive number")
    assert not out.exists()


@pytest.mark.parametrize("field", ["flops_per_s", "recv_bytes_per_s"])
def test_profile_refuses_to_write_a_zero_measurement(tmp_path, capsys, monkeypatch, field):
    _fake_measurement(monkeypatch, **{field: 0.0})
    out = tmp_path / "cpu.yaml"
    assert main(["profile", "--workers", "2", "--seconds", "0.1", "--out", str(out)]) == 2
    _one_line_error(capsys, "which no device file can use")
    assert not out.exists()


# ---- 8. a cap on the number of devices ------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["a100:65537", "a100:65536,v100:1"])  # a100:10**9 ran out of memory
def test_device_count_is_capped(capsys, spec):
    assert main(["plan", "--model", "mlp", "--batch", "8", "--devices", spec]) == 2
    _one_line_error(capsys, "at most 65,536 devices")


# ---- 9. float64 modules trace --------------------------------------------------------------------------------

def test_float64_module_traces():
    module = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)).double()
    net = trace(module, (3, 8, 8), "f64")  # a float32 input would not meet the float64 bias of the conv
    assert [la.d_out for la in net.layers] == [4, 3]


# ---- 10. the Python example's keywords, and --measure's table ---------------------------------------------------

def test_api_docstring_example_uses_real_keywords():
    from hetrain.planner import api as api_module

    call = re.search(r"plan_model\((.*)\)", api_module.__doc__).group(1)
    keywords = re.findall(r"(\w+)=", call)
    assert keywords and set(keywords) <= set(inspect.signature(api_module.plan_model).parameters)


def _measurement(calibrated):
    from hetrain.planner.measure import Measurement

    predicted = {"step_s": 0.010, "compute_s": 0.006, "level_s": [0.004], "level_bytes": [2e6], "rounds": [3]}
    measured = {"step_s": 0.012, "compute_s": 0.007, "level_s": [0.004], "level_bytes": [3e6], "wait_s": 0.0005}
    return Measurement(2, 3, predicted, measured, calibrated)


def test_measure_table_columns():
    lines = _measurement({}).table().splitlines()
    header = next(line for line in lines if "calibrated ms" in line)
    cal_end = header.index("calibrated ms") + len("calibrated ms")
    meas_end = header.index("measured ms") + len("measured ms")
    step = next(line for line in lines if line.startswith("step "))
    assert step[cal_end - 15:cal_end].strip() == "-"  # not calibrated: no repeat of the prediction
    nbytes = next(line for line in lines if "bytes (all pairs)" in line)
    assert nbytes[cal_end - 15:cal_end].strip() == "-" and nbytes[meas_end - 13:meas_end].strip() == "3.00MB"
    calibrated = {"step_s": 0.011, "compute_s": 0.0065, "level_s": [0.0045], "level_bytes": [2e6]}
    step = next(line for line in _measurement(calibrated).table().splitlines() if line.startswith("step "))
    assert math.isclose(float(step[cal_end - 15:cal_end]), 11.0)
