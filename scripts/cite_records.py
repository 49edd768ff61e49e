"""Rewrite citations of the old docs pages to the record files that replaced them.

``docs/decisions.md`` (one page of design decisions) became ``docs/decisions/<id>.md``, one decision
a file, and ``docs/benchmarks.md`` / ``docs/benchmarks-prague.md`` became dated files under
``docs/results/``. Code and docs cited the old pages by section title, e.g.
``(docs/decisions.md, "Warm workers")``; this script rewrites each such citation to name the file,
``(docs/decisions/warm-workers.md)``, from the mapping in ``scripts/cite_records.toml`` (old section
title -> record id; sites whose citation names no title, or a title that needs the reader's
judgement, are listed there by file and a phrase beside them). Re-run it after merging a branch
that still cites the old pages::

    .venv/bin/python scripts/cite_records.py              # hetrain/ tests/ scripts/ benchmarks/ docs/ examples/
    .venv/bin/python scripts/cite_records.py README.md    # given files or folders only
    .venv/bin/python scripts/cite_records.py --check      # list what would change, change nothing

A citation it cannot place is reported (file and line) and left as it is; exit status 1 then.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
MAPPING = Path(__file__).with_suffix(".toml")
DEFAULT_PATHS = ("hetrain", "tests", "scripts", "benchmarks", "docs", "examples", ".ci")
SUFFIXES = {".py", ".md", ".toml", ".cfg", ".txt", ".yml", ".yaml", ".sh", ""}
# The pages that were split (now pointers to the records), and this tool with its data and test.
SKIP = {"docs/decisions.md", "docs/benchmarks.md", "docs/benchmarks-prague.md", "scripts/cite_records.py",
        "scripts/cite_records.toml", "tests/test_docs_records.py"}

# A citation: the old page, optionally in backticks, optionally followed by a quoted section title
# (which may run over a line break, with a comment's `#` on the next line).
CITATION = re.compile(
    r"(?P<tick>`?)(?<![\w/.-])(?P<page>(?:docs/)?(?:decisions|benchmarks-prague|benchmarks)\.md)(?P=tick)"
    r"(?P<titled>,?[ \t]*(?:\n[ \t]*(?:#[ \t]*)?)?\"(?P<title>[^\"]{1,200})\")?"
)
PAGE_KIND = {"decisions.md": "decisions", "benchmarks.md": "results", "benchmarks-prague.md": "results"}


@dataclass
class Mapping:
    titles: dict[str, dict[str, str]]  # kind -> normalized title -> record
    within: dict[str, dict[str, str]]  # kind -> title of a part -> record (the title is kept)
    sites: list[dict[str, str]]        # {path, near, kind, record}

    @classmethod
    def load(cls, path: Path = MAPPING) -> Mapping:
        data = tomllib.loads(path.read_text())
        titles = {kind: {normalize(k): v for k, v in data[kind].items()} for kind in ("decisions", "results")}
        within = {kind: {normalize(k): v for k, v in data.get(f"{kind}_within", {}).items()}
                  for kind in ("decisions", "results")}
        return cls(titles, within, data.get("site", []))


def normalize(title: str) -> str:
    """A section title as the mapping keys it: one line, no comment marks, no trailing "(issue N)"."""
    title = re.sub(r"\s*\n\s*(#\s*)?", " ", title).strip()
    title = re.sub(r"\s*\([^()]*$", "", title)  # "(issue 37: " cut at a quote inside the title
    title = re.sub(r"\s*\((?:issue|respawn|Hop, D-PSGD|Prague, AD-PSGD|`--|20\d\d-)[^()]*(?:\([^()]*\)[^()]*)*\)$",
                   "", title)
    return title.rstrip(".:").strip()


def record_path(kind: str, record: str) -> str:
    return f"docs/{kind}/{record}.md"


def place(mapping: Mapping, rel: str, text: str, match: re.Match) -> tuple[str, bool] | None:
    """The text that replaces one citation, and whether the quoted title is kept; None if unplaced."""
    kind = PAGE_KIND[match["page"].split("/")[-1]]
    window = text[max(0, match.start() - 300):match.end() + 300]
    title = normalize(match["title"]) if match["title"] else None
    for site in mapping.sites:  # a site names its citation's title, if it has one
        if (site["path"] == rel and site["near"] in window and site.get("kind", kind) == kind
                and normalize(site.get("title", "")) == (title or "")):
            return record_path(kind, site["record"]), bool(site.get("keep_title"))
    if match["title"]:
        title = normalize(match["title"])
        if title in mapping.titles[kind]:
            return record_path(kind, mapping.titles[kind][title]), False
        if title in mapping.within[kind]:
            return record_path(kind, mapping.within[kind][title]), True
        # A shortened title: the one section whose title begins with it.
        starting = {record for known, record in mapping.titles[kind].items() if known.startswith(title)}
        if len(starting) == 1:
            return record_path(kind, starting.pop()), False
        # The title of a part (a bold lead) of one record: keep the title after the file.
        holding = sorted(p.stem for p in (ROOT / "docs" / kind).glob("*.md") if f"**{title}" in p.read_text())
        if len(holding) == 1:
            return record_path(kind, holding[0]), True
    return None


def rewrite(text: str, rel: str, mapping: Mapping) -> tuple[str, list[str]]:
    """The text with every citation it can place rewritten, and a message for each it cannot."""
    unplaced: list[str] = []

    def replace(match: re.Match) -> str:
        placed = place(mapping, rel, text, match)
        if placed is None:
            line = text.count("\n", 0, match.start()) + 1
            unplaced.append(f"{rel}:{line}: cannot place {match.group(0)!r}: add it to {MAPPING.name}")
            return match.group(0)
        target, keep_title = placed
        tick = match["tick"]
        new = f"{tick}{target}{tick}"
        if match["titled"] and keep_title:
            new += match["titled"]
        elif match["titled"] and not match["titled"].startswith(",") and text[match.end():match.end() + 1].isalnum():
            new += " "  # `page "Title" and`: keep the file apart from the word that follows
        return new

    return CITATION.sub(replace, text), unplaced


# A citation of a record or a result by its file.
CITED = re.compile(r"docs/(?P<kind>decisions|results)/(?P<name>[\w.-]+?)\.md")


def cited(paths: tuple[str, ...] | list[str] = DEFAULT_PATHS) -> list[tuple[str, str]]:
    """(file, cited path) for every citation of a record or a result in the given files or folders."""
    found = []
    for file, rel in files(paths):
        try:
            text = file.read_text()
        except UnicodeDecodeError:
            continue
        found += [(rel, match.group(0)) for match in CITED.finditer(text)]
    return found


def old_citations(paths: tuple[str, ...] | list[str] = DEFAULT_PATHS) -> list[str]:
    """"file:line: text" for every citation of the old pages left in the given files or folders."""
    left = []
    for file, rel in files(paths):
        try:
            text = file.read_text()
        except UnicodeDecodeError:
            continue
        left += [f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for m in CITATION.finditer(text)]
    return left


def files(paths: tuple[str, ...] | list[str]):
    for name in paths:
        path = (ROOT / name)
        found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()) if path.exists() else []
        for file in found:
            rel = file.relative_to(ROOT).as_posix()
            if rel in SKIP or ".venv" in file.parts or "__pycache__" in file.parts or file.suffix not in SUFFIXES:
                continue
            yield file, rel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", default=list(DEFAULT_PATHS), help="files or folders (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="list the files that would change; change nothing")
    args = parser.parse_args(argv)
    mapping = Mapping.load()
    problems: list[str] = []
    for file, rel in files(args.paths):
        try:
            text = file.read_text()
        except UnicodeDecodeError:
            continue
        new, unplaced = rewrite(text, rel, mapping)
        problems += unplaced
        if new != text:
            print(("would rewrite " if args.check else "rewrote ") + rel)
            if not args.check:
                file.write_text(new)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
