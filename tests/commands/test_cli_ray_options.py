"""``--launcher ray``'s options: bad input is one line and exit 2, before Ray is joined; without Ray
installed the error names the extra. (Jobs on a Ray cluster: tests/ray.)"""

import subprocess
import sys

import pytest

from hetrain.cli import main
from hetrain.errors import UsageError
from hetrain.ray.resources import parse_resources


def _bad(capsys, tmp_path, *args) -> str:
    out = tmp_path / "out"
    code = main(["train", "--out", str(out), "--iterations", "3", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("hetrain: error:"), err
    assert not out.exists(), "bad input must not create the output directory"
    return err[0]


@pytest.mark.parametrize("args, message", [
    (["--launcher", "ray"], "--launcher ray needs --ray-address"),
    (["--launcher", "ray", "--ray-address", "auto", "--ray-worker-resources", "CPU"], "'CPU' is not NAME=AMOUNT"),
    (["--launcher", "ray", "--ray-address", "auto", "--ray-worker-resources", "GPU=one"], "must be a number"),
    (["--launcher", "ray", "--ray-address", "auto", "--ray-worker-resources", "GPU=-1"], "finite number >= 0"),
    (["--launcher", "ray", "--ray-address", "auto", "--ray-worker-resources", "CPU=0"], "reserves nothing"),
    (["--ray-address", "auto"], "go with --launcher ray"),
    (["--launcher", "slurm"], "invalid choice: 'slurm'"),
])
def test_bad_ray_options(capsys, tmp_path, args, message):
    assert message in _bad(capsys, tmp_path, *args)


def test_without_ray_installed_the_error_names_the_extra(processes, tmp_path):
    probe = ("import sys\n"
             "sys.modules['ray'] = None  # import ray raises ImportError, as without hetrain[ray]\n"
             "from hetrain.cli import main\n"
             f"sys.exit(main(['train', '--launcher', 'ray', '--ray-address', 'auto', '--iterations', '5', '--out', {str(tmp_path / 'o')!r}]))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "hetrain: error: --launcher ray (hetrain.ray) needs Ray: pip install 'hetrain[ray]'"]


def test_worker_resources_parse():
    assert parse_resources(None) == {"CPU": 1.0}
    assert parse_resources("GPU=1") == {"GPU": 1.0, "CPU": 1.0}  # CPU 1 unless given
    assert parse_resources("CPU=2, A100=1,GPU=0.5") == {"CPU": 2.0, "A100": 1.0, "GPU": 0.5}
    assert parse_resources("CPU=0,GPU=1") == {"GPU": 1.0}  # a zero amount reserves nothing
    with pytest.raises(UsageError, match="names GPU twice"):
        parse_resources("GPU=1,GPU=2")
    with pytest.raises(UsageError, match="finite"):
        parse_resources("CPU=inf")
