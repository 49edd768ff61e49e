"""`hetrain plan` through hetrain.cli.main: tables, JSON, and one-line errors with exit code 2."""

import json

import pytest

from hetrain.cli import main


def test_table_and_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "alexnet", "--batch", "128", "--devices", "tpu-v3:2,tpu-v2:2",
                 "--json", str(out), "--table"]) == 0
    text = capsys.readouterr().out
    assert "data-parallel" in text and "one-weird-trick" in text and "hypar" in text
    data = json.loads(out.read_text())
    assert set(data["plans"]) == {"plan", "data-parallel", "one-weird-trick", "hypar"}
    assert len(data["plans"]["plan"]["levels"][0]["types"]) == 8
    assert data["speedup_over"]["data-parallel"] >= 1.0 - 1e-9


def test_user_module_and_device_file(tmp_path, capsys):
    mod = tmp_path / "mynet.py"
    mod.write_text("from torch import nn\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                   "        self.a = nn.Linear(32, 64)\n        self.b = nn.Linear(64, 8)\n"
                   "    def forward(self, x):\n        return self.b(self.a(x).relu())\n")
    devs = tmp_path / "devs.yaml"
    devs.write_text("devices:\n  npu: {tflops: 100, memory_gib: 16, link_gb_per_s: 50}\narray: npu:2,a100:2\n")
    assert main(["plan", "--model", f"module:{mod}:Net", "--input-shape", "32", "--batch", "16",
                 "--devices", str(devs), "--objective", "volume", "--types", "2"]) == 0
    assert "npu:2,a100:2" in capsys.readouterr().out


BAD = [
    (["--model", "nosuchnet", "--batch", "8", "--devices", "a100:2"], "unknown model"),
    (["--model", "mlp", "--batch", "8", "--devices", "tpu-v9:2"], "unknown device"),
    (["--model", "mlp", "--batch", "0", "--devices", "a100:2"], "--batch"),
    (["--model", "mlp", "--batch", "8", "--devices", "a100:1"], "at least 2 devices"),
    (["--model", "mlp", "--batch", "8", "--devices", "a100:x"], "not an integer"),
    (["--model", "mlp", "--batch", "8"], "--devices is required"),
]


@pytest.mark.parametrize("argv,needle", BAD)
def test_bad_input_is_one_line_exit_2(argv, needle, capsys):
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err


def test_module_without_weighted_layers(tmp_path, capsys):
    mod = tmp_path / "plain.py"
    mod.write_text("from torch import nn\nclass Plain(nn.Module):\n    def forward(self, x):\n        return x.relu()\n")
    assert main(["plan", "--model", f"module:{mod}:Plain", "--input-shape", "4", "--batch", "2",
                 "--devices", "a100:2"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "no Linear or Conv2d" in err


@pytest.mark.parametrize("content,suffix,needle", [
    ("devices: [1, 2", ".yaml", "not valid YAML"),
    ('{"devices": {"x": {"tflops": -1, "memory_gib": 1, "link_gb_per_s": 1}}, "array": "x:2"}', ".json",
     "positive number"),
    ("devices:\n  x: {tflops: 1}\narray: x:2\n", ".yml", "exactly the fields"),
    ("devices: {}\n", ".yaml", "no 'array'"),
])
def test_malformed_device_file(tmp_path, capsys, content, suffix, needle):
    path = tmp_path / f"devs{suffix}"
    path.write_text(content)
    assert main(["plan", "--model", "mlp", "--batch", "8", "--devices", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err


def test_json_not_written_on_error(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "nosuchnet", "--batch", "8", "--devices", "a100:2", "--json", str(out)]) == 2
    assert not out.exists()
