"""`hetrain plan` through hetrain.cli.main: tables, JSON, and one-line errors with exit code 2."""

import json
import sys

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


def test_model_errors_name_the_argument_in_python_and_the_flag_on_the_command_line(tmp_path, capsys):
    from hetrain.errors import UsageError
    from hetrain.planner import api

    mod = tmp_path / "mynet.py"
    mod.write_text("from torch import nn\nclass Net(nn.Linear):\n    def __init__(self):\n"
                   "        super().__init__(4, 2)\n")
    with pytest.raises(UsageError) as info:
        api.model(f"module:{mod}:Net")  # no input shape
    assert "pass input_shape" in str(info.value) and "--" not in str(info.value)
    assert main(["plan", "--model", f"module:{mod}:Net", "--batch", "8", "--devices", "a100:2"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"--model module:{mod}:Net: pass --input-shape" in err
    with pytest.raises(UsageError, match=r"^model gpt:0x8: write gpt:BLOCKSxWIDTH"):
        api.model("gpt:0x8")
    assert main(["plan", "--model", "gpt:0x8", "--batch", "8", "--devices", "a100:2"]) == 2
    assert "--model gpt:0x8: write gpt:BLOCKSxWIDTH" in capsys.readouterr().err


def test_memory_too_small_for_any_plan(capsys, tmp_path):
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "gpt2-xl", "--batch", "64", "--devices", "tpu-v2:4", "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "does not fit" in err and "short by" in err
    assert not out.exists()


def test_memory_kept_within_capacity_and_baselines_flagged(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "gpt2-xl", "--batch", "64", "--devices", "tpu-v2:8", "--json", str(out),
                 "--table"]) == 0
    data = json.loads(out.read_text())
    plan = data["plans"]["plan"]
    assert plan["memory_fits"] and plan["memory_tightest"]["need_bytes"] <= 16 * 2**30
    assert not data["plans"]["data-parallel"]["memory_fits"]  # 1.56B weights with Adam state replicated
    assert "does not fit in memory: data-parallel" in capsys.readouterr().out
    assert main(["plan", "--model", "gpt2-xl", "--batch", "64", "--devices", "tpu-v2:8", "--ignore-memory",
                 "--json", str(out)]) == 0
    assert not json.loads(out.read_text())["plans"]["plan"]["memory_fits"]


def test_lookahead_flag(tmp_path):
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "alexnet", "--batch", "512", "--devices", "a100:16", "--objective", "volume",
                 "--search", "greedy", "--json", str(out)]) == 0
    greedy = json.loads(out.read_text())["plans"]["plan"]["comm_bytes"]
    assert main(["plan", "--model", "alexnet", "--batch", "512", "--devices", "a100:16", "--objective", "volume",
                 "--search", "lookahead", "--width", "8", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["search"] == "lookahead" and data["width"] == 8
    assert data["plans"]["plan"]["comm_bytes"] <= greedy


def test_torchvision_missing_is_one_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import torchvision raises ImportError
    monkeypatch.setitem(sys.modules, "torchvision.models", None)
    assert main(["plan", "--model", "torchvision:resnet50", "--batch", "8", "--devices", "a100:2"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "torchvision is not installed" in err and "resnet50" in err


def test_torchvision_through_its_api(monkeypatch, tmp_path, capsys):
    """torchvision:NAME calls list_models() and get_model(name, weights=None): a stand-in package with both."""
    pkg = tmp_path / "torchvision"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text(
        "from torch import nn\n"
        "class Tiny(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.conv = nn.Conv2d(3, 8, 3)\n"
        "        self.fc = nn.Linear(8, 10)\n"
        "    def forward(self, x):\n        return self.fc(self.conv(x).mean((2, 3)))\n"
        "CALLS = []\n"
        "def list_models():\n    return ['tiny']\n"
        "def get_model(name, weights='default'):\n    CALLS.append((name, weights))\n    return Tiny()\n")
    for name in ("torchvision", "torchvision.models"):  # recorded, so the stand-in is gone afterwards
        monkeypatch.setitem(sys.modules, name, None)
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "torchvision:tiny", "--batch", "8", "--devices", "a100:2", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["model"] == "torchvision:tiny" and [la["name"] for la in data["layers"]] == ["conv", "fc"]
    assert sys.modules["torchvision.models"].CALLS == [("tiny", None)]
    assert main(["plan", "--model", "torchvision:nosuch", "--batch", "8", "--devices", "a100:2"]) == 2
    assert "torchvision has no model 'nosuch'" in capsys.readouterr().err


def test_real_torchvision_model():
    pytest.importorskip("torchvision", reason="torchvision is optional and not installed here")
    from hetrain.planner.models import load

    assert load("torchvision:resnet50").total_params == 25_557_032


def test_plan_json_says_where_it_wrote(tmp_path, capsys):
    """Issue 70: `--json` runs printed nothing, not even where they wrote."""
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "alexnet", "--batch", "64", "--devices", "a100:2", "--json", str(out)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"wrote {out}"
    assert json.loads(out.read_text())["plans"]
