"""The command line as markdown, from its parser (:func:`hetrain.cli.build_parser`): the site's reference page (docs/reference/cli.md,
filled in by docs/hooks/cli_reference.py at build time), so the page cannot drift from the flags.

Each sub-command gets a section: its one-line help, its usage line, and a table of its flags (names,
value, default, help as ``--help`` prints it).
"""

from __future__ import annotations

import argparse


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise RuntimeError("hetrain's parser has no sub-commands")


def flag_rows(parser: argparse.ArgumentParser) -> list[tuple[str, str, str, str]]:
    """(flags, value, default, help) for each argument of ``parser``, in the order ``--help`` lists them."""
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        names = ", ".join(f"`{name}`" for name in action.option_strings) or f"`{action.dest}`"
        if action.nargs == 0:
            value = ""
        elif action.choices is not None:
            value = " \\| ".join(f"`{choice}`" for choice in action.choices)
        else:
            value = f"`{action.metavar or action.dest.upper()}`"
        default = action.default
        shown = "" if default in (None, argparse.SUPPRESS, False) or action.nargs == 0 else f"`{default}`"
        help_text = formatter._expand_help(action) if action.help else ""
        rows.append((names, value, shown, _cell(help_text)))
    return rows


def cli_markdown(parser: argparse.ArgumentParser) -> str:
    """Markdown for every sub-command of ``parser``: :func:`hetrain.cli.build_parser`'s, for the site."""
    parts = []
    for name, sub in _subparsers(parser).items():
        usage = " ".join(sub.format_usage().split()).removeprefix("usage: ")
        parts += [f"## `hetrain {name}`", "", _cell(sub.description or ""), "", "```text", usage, "```", "",
                  "| flag | value | default | meaning |", "|---|---|---|---|"]
        parts += [f"| {flags} | {value} | {default} | {help_text} |"
                  for flags, value, default, help_text in flag_rows(sub)]
        parts.append("")
    return "\n".join(parts)
