"""Per-protocol options: frozen dataclasses whose fields are the Python arguments of each protocol.

Each protocol's options class (``HopOptions``, ``PragueOptions``, ...) lives
beside its pure logic and has one ``validate(num_workers)``. Its fields are
made with :func:`option`, which records the help text the command line shows;
the CLI derives its flags from the fields (``max_ig`` -> ``--max-ig``), so a
protocol's settings are declared once.

Every options class derives from :class:`ProtocolOptions`, which carries the
protocol's own rules (its default failure mode, whether a replacement worker
may join, how many Group Generator endpoints it needs), so generic code asks
the options object and never names a protocol. The options object is the only
carrier of a protocol's settings: the registry builds it once, and the runtime
and simulated shells take it as ``options=`` (:func:`options_or_settings`
builds it from a public class's keyword arguments instead).

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


TOLERANT = ("continue", "respawn")  # failure modes in which the survivors go on


class ProtocolOptions:
    """The rules every protocol's options answer; a subclass overrides those its protocol differs in.

    Subclasses are frozen dataclasses whose fields are made with :func:`option`.
    """

    def validate(self, num_workers: int):
        """Raise OptionError for settings that cannot work on ``num_workers``; return ``self``."""
        return self

    def default_on_failure(self) -> str:
        """What a worker's death does when the run does not say (``continue``: the survivors go on)."""
        return "continue"

    def supports_respawn(self) -> bool:
        """Whether a replacement worker may join the running job (``on_failure="respawn"``)."""
        return True

    def check_on_failure(self, on_failure: str) -> None:
        """Raise OptionError if these settings cannot handle ``on_failure``; subclasses give the reason."""
        if on_failure in TOLERANT and self.default_on_failure() == "abort":
            raise OptionError("these settings cannot route around a death: use {on_failure} abort")
        if on_failure == "respawn" and not self.supports_respawn():
            raise OptionError("these settings take no replacement worker mid-run: use {on_failure} continue")

    @property
    def local_schedule(self) -> bool:
        """Whether every worker computes its groups itself, so no Group Generator is served."""
        return False

    caches_member_sets = False  # True: it keeps a communicator (and copies) per member set: fit_memory sizes them

    def fit_memory(self, flat_nbytes: int, *, compressed: bool, nccl: bool, num_workers: int | None = None):
        """These options with the communicator cache sized to what fits the memory bound, for a model of
        ``flat_nbytes`` (protocols that cache member sets: :mod:`hetrain.protocols.comm_budget`); the
        launcher's Group Generator and every worker call it with the same inputs. Others: ``self``."""
        return self

    def check_comm(self, comm) -> None:
        """Raise OptionError if this protocol cannot honour ``comm`` (a :class:`~hetrain.comm.settings.CommSettings`)."""

    def scheduler_endpoints(self) -> int:
        """Group Generator endpoints a job of these settings needs (one unless it shards its generator)."""
        return 1


def options_or_settings(options_cls, options, settings: dict, owner: str):
    """``options`` as given, or an ``options_cls`` built from a public class's keyword ``settings``.

    Raises TypeError, as Python does for a bad call, when both are given or a setting is unknown.
    """
    if options is not None:
        if settings:
            raise TypeError(f"{owner}() takes options= or keyword settings, not both (got {sorted(settings)})")
        if not isinstance(options, options_cls):
            raise TypeError(f"{owner}() options= must be a {options_cls.__name__}, got {type(options).__name__}")
        return options
    names = {f.name for f in dataclasses.fields(options_cls)}
    for name in settings:
        if name not in names:
            raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}")
    return options_cls(**settings)


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
