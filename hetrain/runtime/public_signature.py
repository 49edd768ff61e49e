"""What ``help()`` shows of a public protocol class: every setting it takes, with its default.

A protocol's own settings are its options class's fields and the communication settings are
:class:`~hetrain.comm.settings.CommSettings`' fields; both are declared once, there (default and help
text), and a public class takes them as keywords (``hetrain.Hop(model, opt, backup=1, sync_every=4)``).
:func:`document_settings` writes them into the class's signature (``inspect.signature``, which
``help()`` and IDEs read) and appends an ``Args:`` block to its docstring, from those fields, so
nothing is written twice and nothing a class takes is hidden behind ``**settings``.
"""

from __future__ import annotations

import dataclasses
import inspect

from hetrain.comm import settings as comm_carrier

_CALLER_ARGS = {  # the arguments every public class takes beside the settings
    "model": "the torch.nn.Module to train (its parameters and floating-point buffers are averaged)",
    "optimizer": "its optimizer: a step post-hook synchronises after every optimizer.step() (None: call "
                 "sync.step() yourself)",
    "options": "the settings below as one options object instead of keywords",
    "comm": "the communication settings below as one CommSettings instead of keywords",
    "seed": "the Group Generator's random draws (the same on every worker)",
    "process_group": "the workers' group (None: the world)",
    "timeout_s": "the longest any blocking wait may last before the worker fails, naming what it waited for",
    "on_failure": "abort | continue | respawn: what a death does (continue: route around it)",
    "dead_workers": "a callable returning the ranks known dead (the local launcher's ctx.dead_workers)",
    "gg_address": "(host, port) of a Group Generator served elsewhere (None: the launcher's, or rank 0's)",
}


def document_settings(cls: type, options_cls: type) -> type:
    """Give ``cls`` an explicit keyword signature and an ``Args:`` block for its options and
    communication settings (see the module docstring); returns ``cls`` (usable as a decorator)."""
    signature = inspect.signature(cls.__init__)
    given = [p for name, p in signature.parameters.items() if name != "self" and p.kind != p.VAR_KEYWORD]
    settings = [(f, f.default) for f in dataclasses.fields(options_cls) if "help" in f.metadata]
    settings += [(f, f.default) for f in comm_carrier.comm_fields()]
    keywords = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default) for f, default in settings]
    cls.__signature__ = signature.replace(parameters=given[:2] + keywords + given[2:],
                                          return_annotation=inspect.Signature.empty)
    lines = ["", "Args:"]
    for p in given:
        lines.append(f"    {p.name}: {_CALLER_ARGS.get(p.name, '')}".rstrip())
    for f, default in settings:
        lines.append(f"    {f.name} (default {default!r}): {f.metadata['help']}")
    lines.append("    link: a LinkSpec (or its --link-mbps text) for link_mbps and link_latency_ms at once")
    cls.__doc__ = (inspect.cleandoc(cls.__doc__ or "") + "\n" + "\n".join(lines)).strip() + "\n"
    return cls
