"""Design records and results are cited by file, and every cited file exists.

``docs/decisions.md`` and the benchmark pages were split into ``docs/decisions/<id>.md`` (one decision
a file) and ``docs/results/<date>-<slug>.md`` (one measured result a file); ``scripts/cite_records.py``
rewrites the old citations. These tests check that every record or result cited in hetrain/, tests/,
scripts/, benchmarks/ and docs/ exists, that no citation of the old pages is left, that every record
and result has its parts and is listed on its index, and that the rewrite itself does what it says.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ["hetrain", "tests", "scripts", "benchmarks", "docs"]


def cite_records():
    """scripts/cite_records.py as a module (the one a mutant patched, if one did)."""
    if "cite_records" not in sys.modules:
        spec = importlib.util.spec_from_file_location("cite_records", ROOT / "scripts" / "cite_records.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["cite_records"] = module
        spec.loader.exec_module(module)
    return sys.modules["cite_records"]


def test_every_cited_record_and_result_exists():
    cited = cite_records().cited(CHECKED)
    assert ("hetrain/jobs/warm_start.py", "docs/decisions/warm-workers.md") in cited, "the finder saw no citation"
    missing = sorted({f"{path} (cited in {where})" for where, path in cited if not (ROOT / path).is_file()})
    assert not missing, f"cited but not there: {missing}"


def test_no_citation_of_the_old_pages_is_left():
    left = cite_records().old_citations(CHECKED)
    assert not left, f"citations of the split pages (run scripts/cite_records.py): {left}"


def test_links_between_records_and_results_resolve():
    broken = []
    for page in sorted((ROOT / "docs").glob("*/*.md")) + sorted((ROOT / "docs").glob("*.md")):
        for target in re.findall(r"\]\(([^)#\s]+)\)", page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_every_record_has_its_parts_and_is_on_the_index():
    folder = ROOT / "docs" / "decisions"
    index = (folder / "index.md").read_text()
    for record in sorted(folder.glob("*.md")):
        if record.name == "index.md":
            continue
        text = record.read_text()
        assert text.startswith("# "), f"{record.name}: no title"
        assert re.search(r"^Status", text, re.M), f"{record.name}: no status / date line"
        for part in ("## Context", "## Decision"):
            assert part in text, f"{record.name}: no {part[3:]}"
        assert f"]({record.name})" in index, f"{record.name} is not on docs/decisions/index.md"


def test_every_result_names_its_date_machine_commit_and_command_and_is_on_the_index():
    folder = ROOT / "docs" / "results"
    index = (folder / "index.md").read_text()
    for result in sorted(folder.glob("20*.md")):
        assert re.fullmatch(r"\d{4}-\d\d-\d\d-[a-z0-9-]+\.md", result.name), f"{result.name}: not <date>-<slug>.md"
        text = result.read_text()
        for field in ("**Date:**", "**Machine:**", "**Commit:**", "**Command:**"):
            assert field in text, f"{result.name}: no {field}"
        assert f"]({result.name})" in index, f"{result.name} is not on docs/results/index.md"


def test_a_citation_by_title_over_a_line_break_names_the_record_file():
    tool = cite_records()
    text = 'x = 1  # the fork server (docs/decisions.md, "Warm\n# workers"). Then\n'
    new, unplaced = tool.rewrite(text, "hetrain/example.py", tool.Mapping.load())
    assert unplaced == []
    assert new == "x = 1  # the fork server (docs/decisions/warm-workers.md). Then\n"


def test_a_citation_of_a_part_of_a_record_keeps_the_part_s_title():
    tool = cite_records()
    text = 'see `docs/decisions.md`, "What it costs" and docs/benchmarks.md, "Soak".'
    new, unplaced = tool.rewrite(text, "docs/example.md", tool.Mapping.load())
    assert unplaced == []
    assert new == ('see `docs/decisions/outer-step-off-the-complete-graph.md`, "What it costs" and '
                   "docs/results/2026-12-01-soak.md.")


def test_a_citation_it_cannot_place_is_reported_and_left_as_it_was():
    tool = cite_records()
    text = 'kept (docs/decisions.md, "No such section")\n'
    new, unplaced = tool.rewrite(text, "hetrain/example.py", tool.Mapping.load())
    assert new == text
    assert len(unplaced) == 1 and unplaced[0].startswith("hetrain/example.py:1: cannot place")
