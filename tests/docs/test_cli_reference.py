"""The site's command-line reference is generated from hetrain.cli's parser: every flag of every command is
on it, with its help, so the page cannot drift from the command line."""

import argparse

from hetrain.cli import COMMANDS, build_parser
from hetrain.cli_markdown import cli_markdown


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_the_reference_names_every_flag_of_every_command():
    page = cli_markdown(build_parser())
    sections = page.split("## `hetrain ")[1:]
    assert [section.split("`", 1)[0] for section in sections] == list(COMMANDS)
    for section, (name, parser) in zip(sections, _commands().items()):
        rows = [line for line in section.splitlines() if line.startswith("| `")]
        flags = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
        assert len(rows) == len(flags), f"hetrain {name}: {len(flags)} flags, {len(rows)} rows"
        for action, row in zip(flags, rows):
            assert row.startswith(f"| `{(action.option_strings or [action.dest])[0]}`"), (name, row)


def test_a_flag_s_help_and_choices_are_on_its_row():
    train = cli_markdown(build_parser()).split("## `hetrain compare`")[0]
    row = next(line for line in train.splitlines() if line.startswith("| `--workload`"))
    assert "`mlp` \\| `cnn` \\| `synthetic` \\| `lm`" in row and "byte-level GPT" in row
    usage = train.split("```text\n", 1)[1].split("\n```", 1)[0]
    assert usage.startswith("hetrain train [-h]") and "--out OUT" in usage
