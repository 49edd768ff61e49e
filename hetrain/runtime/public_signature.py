"""The keywords of a public protocol class: written out in its ``def``, defaults and help read from the fields.

A protocol's own settings are its options class's fields and the communication settings are
:class:`~hetrain.comm.settings.CommSettings`' fields; both are declared once, there (default and help
text). A public class writes each out as a keyword-only parameter of its ``__init__`` whose default is
read from the dataclass (``backup: int | None = HopOptions.backup``), so type checkers and IDEs see every
keyword a class takes and each default still lives in one place (docs/decisions/keywords-in-each-def.md).

:func:`keywords_given` collects, first thing in ``__init__``, the settings a call gave (for
:func:`~hetrain.runtime.protocol.comm_from` and :func:`~hetrain.protocols.options.options_or_settings`,
which build the two objects); :func:`document_settings` appends an ``Args:`` block to the class's
docstring from the fields' help. ``tests/runtime/test_api.py`` checks each ``def`` against the fields.
"""

from __future__ import annotations

import dataclasses
import inspect

from hetrain.comm import settings as comm_carrier
from hetrain.protocols.options import option_fields

_CALLER_ARGS = {  # the arguments every public class takes beside the settings
    "model": "the torch.nn.Module to train (its parameters and floating-point buffers are averaged)",
    "optimizer": "its optimizer: a step post-hook synchronises after every optimizer.step() (None: call "
                 "sync.step() yourself)",
    "link": "a LinkSpec (or its --link-mbps text) for link_mbps and link_latency_ms at once",
    "options": "the protocol's settings above as one options object instead of keywords",
    "comm": "the communication settings above as one CommSettings instead of keywords",
    "seed": "the Group Generator's random draws (the same on every worker)",
    "process_group": "the workers' group (None: the world)",
    "timeout_s": "the longest any blocking wait may last before the worker fails, naming what it waited for",
    "on_failure": "abort | continue | respawn: what a death does (continue: route around it)",
    "dead_workers": "a callable returning the ranks known dead (the local launcher's ctx.dead_workers)",
    "gg_address": "(host, port) of a Group Generator served elsewhere (None: the launcher's, or rank 0's)",
    "transport": "the Transport to communicate through, for launchers and tests (None: built from "
                 "process_group and dead_workers; give one or those, not both)",
}


def setting_fields(options_cls: type) -> list[dataclasses.Field]:
    """The settings a public class of ``options_cls`` takes as keywords: its options, then the communication ones."""
    return [*option_fields(options_cls), *comm_carrier.comm_fields()]


def keywords_given(call: dict, options_cls: type) -> dict:
    """The settings a call gave, by name, from the ``locals()`` of a public class's ``__init__`` (taken before
    any other name is bound): every field of ``options_cls`` and of CommSettings whose value is not its
    default, and ``link`` if given. A keyword left at its field's default counts as not given, so ``options=``
    or ``comm=`` beside it is no conflict (the object's value stands)."""
    given = {f.name: call[f.name] for f in setting_fields(options_cls)
             if f.name in call and not _is_default(call[f.name], f.default)}  # a field without its keyword: the
    # object only (comm=, options=) until the def names it (tests/runtime/test_api.py fails until then)
    if call.get("link") is not None:
        given["link"] = call["link"]
    return given


def _is_default(value, default) -> bool:
    """``value`` is ``default`` itself or equal to it and of its type (1.0 for an int setting is given: it is refused)."""
    return value is default or (type(value) is type(default) and value == default)


def document_settings(cls: type, options_cls: type) -> type:
    """Append an ``Args:`` block to ``cls``'s docstring, in its ``__init__``'s order: each setting with its
    default and help, from its field (see the module docstring), and the class's other arguments; returns
    ``cls`` (usable as a decorator)."""
    settings = {f.name: f for f in setting_fields(options_cls)}
    lines = ["", "Args:"]
    for name in inspect.signature(cls.__init__).parameters:
        if name in settings:
            lines.append(f"    {name} (default {settings[name].default!r}): {settings[name].metadata['help']}")
        elif name != "self":
            lines.append(f"    {name}: {_CALLER_ARGS.get(name, '')}".rstrip())
    cls.__doc__ = (inspect.cleandoc(cls.__doc__ or "") + "\n" + "\n".join(lines)).strip() + "\n"
    return cls
