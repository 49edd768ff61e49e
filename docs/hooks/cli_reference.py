"""mkdocs hook: fill docs/reference/cli.md's marker with the command line's reference, generated from
hetrain.cli's parser at build time (hetrain.cli_markdown), so the page always matches the flags."""

from __future__ import annotations

MARKER = "<!-- cli-reference -->"


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri != "reference/cli.md":
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"docs/reference/cli.md lost its {MARKER} marker: the generated reference goes there")
    from hetrain.cli import build_parser
    from hetrain.cli_markdown import cli_markdown

    return markdown.replace(MARKER, cli_markdown(build_parser()))
