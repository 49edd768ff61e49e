"""The code blocks of the README and the documentation, for the tests that run or check them.

A fenced block opens with three backticks and a language (```python, ```bash) at the start of a
line and closes with three backticks. Blocks are returned with the file and the line they start on,
so a failing check can name them.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pyflakes.checker

ROOT = Path(__file__).resolve().parents[2]
_FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # the fence's line, 1-based
    language: str
    text: str

    @property
    def where(self) -> str:
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{path}:{self.line}"


def blocks(path: Path, language: str | None = None) -> list[Block]:
    """The fenced blocks of one markdown file (of ``language`` only, if given)."""
    found, open_at, lang, lines = [], None, "", []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        fence = _FENCE.match(line)
        if open_at is None and line.startswith("```"):
            open_at, lang, lines = number, line[3:].strip(), []
        elif open_at is not None and fence and not fence.group(1):
            if language is None or lang == language:
                found.append(Block(path, open_at, lang, "\n".join(lines) + "\n"))
            open_at = None
        elif open_at is not None:
            lines.append(line)
    return found


def documentation_files() -> list[Path]:
    """README.md and every markdown file under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def pyflakes_messages(block: Block) -> list[str]:
    """pyflakes' findings on one block, compiled alone (no name from another block is known)."""
    try:
        tree = ast.parse(block.text, filename=block.where)
    except SyntaxError as exc:
        return [f"{block.where}: line {exc.lineno} of the block: syntax error: {exc.msg}"]
    checker = pyflakes.checker.Checker(tree, filename=block.where)
    return [f"{block.where}: line {m.lineno} of the block: {m.message % m.message_args}"
            for m in sorted(checker.messages, key=lambda m: m.lineno)]


def undefined_names(block: Block) -> list[str]:
    """What makes a block fail as written: a syntax error or a name it uses and never defines."""
    return [m for m in pyflakes_messages(block) if "syntax error" in m or "undefined name" in m]
