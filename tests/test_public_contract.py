"""hetrain's public contract, frozen: ``hetrain.__all__``, the signature of each name in it, the public
methods and properties of each protocol class, and every flag of every command (the shape of
torchtitan's ``test_no_new_cli_options.py``). A change to any of them fails here until the snapshot
is written again, so that it is a deliberate one:

    .venv/bin/python tests/test_public_contract.py --update

and the change goes in docs/changelog.md.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path

SNAPSHOT = Path(__file__).parent / "data" / "public_contract.json"


def public_contract() -> dict:
    import hetrain
    from hetrain.cli import build_parser

    names, classes = {}, {}
    for name in sorted(hetrain.__all__):
        obj = getattr(hetrain, name)
        try:
            names[name] = f"{name}{inspect.signature(obj)}"
        except (TypeError, ValueError):
            names[name] = type(obj).__name__
        if any(obj is cls for cls in _protocol_classes(hetrain)):
            classes[name] = sorted(attr for attr in dir(obj) if not attr.startswith("_"))
    return {"__all__": names, "protocol_surface": classes, "cli": _flags(build_parser())}


def _protocol_classes(hetrain) -> list[type]:
    from hetrain.runtime.protocol import SyncProtocol

    return [getattr(hetrain, n) for n in hetrain.__all__
            if inspect.isclass(getattr(hetrain, n)) and issubclass(getattr(hetrain, n), SyncProtocol)]


def _flags(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    commands = {}
    for action in parser._actions:  # argparse keeps its sub-commands here; no public accessor exists
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in sorted(action.choices.items()):
                commands[command] = sorted(option for a in sub._actions for option in a.option_strings)
    return commands


def test_the_public_contract_is_the_snapshot():
    now, frozen = public_contract(), json.loads(SNAPSHOT.read_text())
    for part in ("__all__", "protocol_surface", "cli"):
        added = {k: v for k, v in now[part].items() if frozen[part].get(k) != v}
        removed = {k: v for k, v in frozen[part].items() if now[part].get(k) != v}
        assert not added and not removed, (
            f"hetrain's {part} changed: now {added}, was {removed}. If that is meant, run "
            f"`.venv/bin/python tests/test_public_contract.py --update` and say so in docs/changelog.md")


if __name__ == "__main__":
    if sys.argv[1:] == ["--update"]:
        SNAPSHOT.write_text(json.dumps(public_contract(), indent=1, sort_keys=True) + "\n")
        print(f"wrote {SNAPSHOT}")
    else:
        sys.exit("usage: tests/test_public_contract.py --update")
