"""The documentation site builds with `mkdocs build --strict` (a broken link, a missing page in the nav or
a failing API page fails it), and its generated pages hold the command line and the docstrings."""

import os
import subprocess
import sys

import pytest
from doc_blocks import ROOT

from hetrain.cli import build_parser


def test_the_site_builds_strict_with_the_generated_references(processes, tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr[-3000:]
    cli_page = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    parser = build_parser()
    sub = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    missing = [f"{name} {flag}" for name, command in sub.choices.items() for action in command._actions
               for flag in action.option_strings[:1] if flag != "-h" and f"<code>{flag}</code>" not in cli_page]
    assert not missing, f"flags missing from the built CLI reference: {missing[:10]}"
    api_page = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    from hetrain.runtime.hop import Hop

    assert Hop.__doc__.splitlines()[0].split("(")[0].strip() in api_page
    assert (site / "guides" / "train-and-compare" / "index.html").exists()
