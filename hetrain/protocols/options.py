"""Per-protocol options: frozen dataclasses whose fields are the Python arguments of each protocol.

Each protocol's options class (``HopOptions``, ``PragueOptions``, ...) lives
beside its pure logic and has one ``validate(num_workers)``. Its fields are
made with :func:`option`, which records the help text the command line shows;
the CLI derives its flags from the fields (``max_ig`` -> ``--max-ig``), so a
protocol's settings are declared once.

Errors name the *Python argument*: ``OptionError("{max_ig} must be >= 1")``
reads "max_ig must be >= 1" from Python and "--max-ig must be >= 1" from the
command line (:meth:`OptionError.for_cli`).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from hetrain.errors import UsageError

_PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")


class OptionError(UsageError):
    """Bad option value; ``template`` marks argument names as ``{name}``."""

    def __init__(self, template: str):
        self.template = template
        super().__init__(_PLACEHOLDER.sub(lambda m: m.group(1), template))

    def for_cli(self, flags: dict[str, str] | None = None) -> str:
        """The message with flags: ``{max_ig}`` becomes ``--max-ig`` (``flags`` maps names that differ)."""
        flags = flags or {}
        return _PLACEHOLDER.sub(lambda m: flags.get(m.group(1), "--" + m.group(1).replace("_", "-")), self.template)


def option(default: Any = None, *, help: str, type: type = int, choices: tuple | None = None) -> Any:  # noqa: A002
    """A dataclass field that is also a command-line flag (``--name-with-dashes``)."""
    return dataclasses.field(default=default, metadata={"help": help, "type": type, "choices": choices})


def option_fields(options_cls) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(options_cls) if "help" in f.metadata]


def options_from(options_cls, values: dict) -> Any:
    """An ``options_cls`` from ``values`` (by Python name): names it lacks are ignored, None means default."""
    names = {f.name for f in dataclasses.fields(options_cls)}
    return options_cls(**{k: v for k, v in values.items() if k in names and v is not None})


def check_at_least(name: str, value, minimum, why: str = "") -> None:
    if value is not None and value < minimum:
        raise OptionError(f"{{{name}}} must be >= {minimum}, got {value}{why}")
