"""The ``hetrain`` command line: one sub-command per module in ``hetrain.commands``.

Every sub-command module defines ``HELP`` (one line), ``add_arguments(parser)``
and ``run(args) -> int``. Modules are imported only when their command runs, so
``hetrain plan`` never imports the distributed runtime.
"""

from __future__ import annotations

import argparse
import atexit
import difflib
import importlib
import os
import signal
import sys
import threading

from hetrain.config import FLAG_NAMES
from hetrain.errors import Terminated, UsageError, WorkerError
from hetrain.protocols.options import OptionError

COMMANDS = {
    "train": "hetrain.commands.train",
    "compare": "hetrain.commands.compare",
    "topology": "hetrain.commands.topology",
    "simulate": "hetrain.commands.simulate",
    "plan": "hetrain.commands.plan",
    "profile": "hetrain.commands.profile",
    "advise": "hetrain.commands.advise",
}


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is a one-line error with exit code 2 (as ours are), and an unknown flag
    names the nearest one it may have meant."""

    command: str | None = None  # the sub-command being parsed (set on the top parser): whose --help to name

    def error(self, message: str):  # noqa: D401 - argparse API
        where = "" if self.prog == "hetrain" else f"{self.prog}: "
        help_of = f"hetrain {self.command}" if self.command and self.prog == "hetrain" else self.prog
        raise UsageError(f"{where}{message}{self._suggestion(message)} (see `{help_of} --help`)")

    def _suggestion(self, message: str) -> str:
        if not message.startswith("unrecognized arguments:"):
            return ""
        flags = set(_option_strings(self))
        unknown = [word.split("=")[0] for word in message.split(":", 1)[1].split() if word.startswith("--")]
        for word in unknown:
            close = difflib.get_close_matches(word, flags, n=1, cutoff=0.75)
            if close:
                return f"; did you mean {close[0]}?"
        return ""


class _Help(argparse.HelpFormatter):
    """Every flag's help states its default, unless the help already speaks of it (or there is none to state)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (action.option_strings and action.default not in (None, False, argparse.SUPPRESS)
                and "default" not in text and "%(default)" not in text):
            text += " (default: %(default)s)"
        return text


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every flag of ``parser`` and of its sub-commands' parsers."""
    found = []
    for action in parser._actions:  # argparse has no public accessor for its actions
        found.extend(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.extend(_option_strings(sub))
    return found


def _build_parser(command: str | None) -> argparse.ArgumentParser:
    parser = _Parser(prog="hetrain", description="Heterogeneity-aware distributed training on PyTorch.")
    parser.command = command
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, module_name in COMMANDS.items():
        if command is not None and name != command:
            sub.add_parser(name, help=f"see `hetrain {name} --help`")
            continue
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=module.HELP, description=module.HELP, formatter_class=_Help)
        module.add_arguments(p)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The whole parser, every sub-command's flags (the documentation's command-line reference reads it)."""
    return _build_parser(None)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    sigterm = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    try:
        parser = _build_parser(command)
        if not argv:
            parser.print_help()
            return 2
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        module = importlib.import_module(COMMANDS[args.command])
        return int(module.run(args) or 0)
    except UsageError as exc:
        message = exc.for_cli(FLAG_NAMES) if isinstance(exc, OptionError) else str(exc)
        print(f"hetrain: error: {message}", file=sys.stderr)
        return 2
    except WorkerError as exc:
        print(f"hetrain: job failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        if isinstance(exc, Terminated):
            print("hetrain: terminated (SIGTERM)", file=sys.stderr)
            return 143
        print("hetrain: interrupted", file=sys.stderr)
        return 130
    finally:  # train and compare take SIGTERM as a stop while they run (a caller in-process gets its own back)
        if sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)


def console_main() -> None:
    """The ``hetrain`` command: :func:`main`, then leave without tearing the interpreter down.

    Everything is written and flushed by then; what is left is finalizing torch's modules, which
    takes 0.45-0.7 s here (docs/decisions/warm-workers.md). The exit
    handlers still run (multiprocessing's finalizers release the job's semaphores).
    """
    code = main()
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    console_main()
