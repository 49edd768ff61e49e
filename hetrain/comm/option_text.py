"""``NAME=VALUE`` texts (the benchmarks' ``--option``) into protocol options and communication settings.

    options, comm = split_options(dict(parse_option(t) for t in ("max_ig=4", "compression=int8")))
    RunConfig(..., options=options, comm=comm)

A communication setting's text is read as its flag reads it (``sync_every=8``: an int;
``compression=4``: the text "4", which the settings then refuse by name); a protocol option's
by :func:`guess_value` (a bool, an int, a float, or the text).
"""

from __future__ import annotations

import dataclasses

from hetrain.comm.settings import CommSettings
from hetrain.errors import UsageError

COMM_FIELDS = {f.name: f for f in dataclasses.fields(CommSettings)}
COMM_NAMES = frozenset(COMM_FIELDS)


def parse_option(text: str) -> tuple[str, str]:
    """``"NAME=VALUE"`` -> (name, value text); anything else is a UsageError saying so."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise UsageError(f"--option {text!r}: write NAME=VALUE, e.g. max_ig=4")
    return name, value


def guess_value(value: str) -> object:
    """A protocol option's value from its text: a bool, an int, a float, or the text."""
    if value.lower() in ("true", "false"):  # not the string "false", which reads as true
        return value.lower() == "true"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def split_options(named: dict[str, str]) -> tuple[dict, dict]:
    """(protocol options, communication settings) from name -> value text: RunConfig takes them in
    different fields. A setting whose text its flag would refuse is a UsageError."""
    options, comm = {}, {}
    for name, value in named.items():
        if name in COMM_NAMES:
            kind = COMM_FIELDS[name].metadata["type"]
            try:
                comm[name] = kind(value)
            except ValueError:
                what = {int: "an integer", float: "a number"}.get(kind, kind.__name__)
                raise UsageError(f"--option {name}={value}: {name} takes {what}") from None
        else:
            options[name] = guess_value(value)
    return options, comm
