"""The README's examples run as written: its shell lines that train (with a shorter --time-budget) and its
Python API block, saved as the README says and run under torchrun (issue 70)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from doc_blocks import ROOT, blocks

README = ROOT / "README.md"
BIN = Path(sys.executable).parent  # the venv's bin: `hetrain` and `torchrun`, as after `source .venv/bin/activate`
BUDGET_S = 3


def _training_lines() -> list[str]:
    """The README's shell commands that train (`hetrain train`/`hetrain compare`), continuation lines joined."""
    lines = []
    for block in blocks(README, "bash"):
        text = block.text.replace("\\\n", " ")
        lines += [line.split("#")[0].strip() for line in text.splitlines()
                  if line.startswith(("hetrain train", "hetrain compare"))]
    return lines


def _activated_env() -> dict:
    return dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1")


def test_the_readme_first_run_trains_and_writes_what_it_says(processes, tmp_path):
    lines = _training_lines()
    assert lines, "README.md has no `hetrain train`/`hetrain compare` line in a bash block"
    for line in lines:
        assert "--time-budget" in line, f"a README command with no budget: {line}"
        short = re.sub(r"--time-budget \S+", f"--time-budget {BUDGET_S}", line) + " --no-progress"
        done = subprocess.run(["bash", "-c", short], cwd=tmp_path, env=_activated_env(), capture_output=True,
                              text=True, timeout=55)
        assert done.returncode == 0, f"{short}\n{done.stderr[-2000:]}"
        out = tmp_path / re.search(r"--out (\S+)", line).group(1)
        protocols = re.search(r"--protocols (\S+)", line).group(1).split(",")
        for name in ("summary.md", "summary.json", "over_time.png"):  # what the README says it writes
            assert (out / name).is_file(), f"{short}: no {name}"
        assert (out / "over_time.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", "over_time.png is no PNG"
        summary = json.loads((out / "summary.json").read_text())
        rates = {row["protocol"]: row["samples_per_s"] for row in summary["runs"]}
        assert sorted(rates) == sorted(protocols) and all(rate > 0 for rate in rates.values()), rates
        assert done.stdout.count("| protocol ") == 1  # it prints one table


WRAPPER = """\
import hashlib, json, os, runpy, sys
names = runpy.run_path("train.py")  # the README's block, as written
flat = b"".join(p.detach().double().numpy().tobytes() for p in names["model"].parameters())
with open(f"rank{names['rank']}.json", "w") as handle:
    json.dump({"digest": hashlib.sha256(flat).hexdigest(), "iterations": names["sync"].metrics()["iterations"]}, handle)
"""


def test_the_readme_python_api_block_trains_to_one_consensus_model(processes, tmp_path):
    """Saved as train.py and run under torchrun as the README says (2 ranks rather than 4, for time):
    every rank trains its 200 steps and leaves the block holding the same model."""
    readme = README.read_text(encoding="utf-8")
    assert "torchrun --standalone --nproc-per-node 4 train.py" in readme
    (python_block,) = blocks(README, "python")
    (tmp_path / "train.py").write_text(python_block.text)
    (tmp_path / "as_written.py").write_text(WRAPPER)
    ranks = 2
    done = subprocess.run([str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={ranks}", "as_written.py"],
                          cwd=tmp_path, env=_activated_env(), capture_output=True, text=True, timeout=55)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(ranks)]
    assert [r["iterations"] for r in reports] == [200] * ranks
    assert len({r["digest"] for r in reports}) == 1, "the ranks left the block with different models"
    printed = [line for line in done.stdout.splitlines() if "final loss" in line]
    assert len(printed) == ranks
