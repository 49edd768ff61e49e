"""Every ```python block of the README and the docs compiles alone with no undefined name (pyflakes), and
the README stays a first contact: short, naming how to set up and how to test (issue 70)."""

import re

import pytest
from doc_blocks import ROOT, Block, blocks, documentation_files, undefined_names

PYTHON_BLOCKS = [block for path in documentation_files() for block in blocks(path, "python")]


def test_the_readme_and_the_guides_have_python_blocks():
    where = {block.path.relative_to(ROOT).parts[0] for block in PYTHON_BLOCKS}
    assert {"README.md", "docs"} <= where
    assert len(PYTHON_BLOCKS) >= 8


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[block.where for block in PYTHON_BLOCKS])
def test_no_python_block_uses_a_name_it_does_not_define(block):
    assert undefined_names(block) == []


def test_the_check_finds_an_undefined_name_a_syntax_error_and_passes_a_complete_block(tmp_path):
    """The check can fail: a block using names it never defines (the old README's MyNet, loader,
    loss_fn) is reported, each name once; so is a block that does not parse."""
    page = tmp_path / "page.md"
    page.write_text("text\n\n```python\nimport torch\nmodel = MyNet()\nfor x, y in loader:\n"
                    "    loss_fn(model(x), y)\n```\n\n```python\nif True\n```\n\n"
                    "```python\nimport torch\nx = torch.zeros(2)\nprint(x.sum())\n```\n\n```bash\nls $nothing\n```\n")
    found = blocks(page, "python")
    assert [block.line for block in found] == [3, 10, 14]
    assert all(isinstance(block, Block) for block in found)
    first = undefined_names(found[0])
    assert len(first) == 3
    assert [name for name in ("MyNet", "loader", "loss_fn") if any(f"'{name}'" in m for m in first)] == [
        "MyNet", "loader", "loss_fn"]
    assert all(m.startswith(f"{found[0].where}: line ") for m in first)
    assert "syntax error" in undefined_names(found[1])[0]
    assert undefined_names(found[2]) == []


def test_the_readme_is_a_first_contact():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    for must in ("scripts/setup-env", "source .venv/bin/activate", "scripts/demo", "scripts/test --quick",
                 "scripts/test -m slow", "pip install -e '.[docs]'"):
        assert must in readme, f"README.md no longer names {must!r}"


def test_every_page_the_readme_links_to_exists():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = {target.split("#")[0] for target in re.findall(r"\]\(([^)\s]+)\)", readme)
               if not target.startswith(("http", "#"))}
    assert targets
    missing = sorted(target for target in targets if not (ROOT / target).exists())
    assert not missing, f"README.md links to missing files: {missing}"

