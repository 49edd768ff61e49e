"""hetrain's modules import each other without a cycle, read from the source (no module is imported).

The module-level imports must form no cycle; neither may they with the imports
deferred into functions added (a deferred import that closes a loop, as
``group_generator`` and ``sharded_gg`` once had, hides the loop, not removes it).
"""

import ast
from pathlib import Path

import pytest

import hetrain

PACKAGE = Path(hetrain.__file__).parent


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imports(tree: ast.Module, name: str, is_package: bool, deferred: bool):
    """(name, fallback) pairs the module imports: ``name`` if it is a module, else ``fallback`` (the
    package it comes from). Module-level statements (``if``/``try`` included), and with ``deferred``
    also the imports inside functions and classes."""
    stack = list(ast.walk(tree)) if deferred else list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import):
            yield from ((alias.name, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name if is_package else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            for alias in node.names:  # ``from package import module`` imports the module, else the package
                yield f"{base}.{alias.name}", base
        elif isinstance(node, (ast.If, ast.Try)) and not deferred:
            stack.extend(getattr(node, "body", []) + getattr(node, "orelse", []) + getattr(node, "finalbody", []))
            for handler in getattr(node, "handlers", []):
                stack.extend(handler.body)


def import_graph(deferred: bool = False) -> dict[str, set[str]]:
    """Each hetrain module -> the hetrain modules it imports (at module level; with ``deferred``, anywhere)."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        targets = {target if target in modules else fallback
                   for target, fallback in _imports(tree, name, path.name == "__init__.py", deferred)}
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_cycle_and_accepts_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_sees_the_imports_it_should():
    graph = import_graph()
    assert "hetrain.protocols.group_generator" in graph["hetrain.protocols.sharded_gg"]
    assert "hetrain.protocols.gg_modes.base" in graph["hetrain.protocols.gg_modes.smart"]
    assert "hetrain.registry" not in graph["hetrain.config"]  # imported inside a method only
    assert "hetrain.registry" in import_graph(deferred=True)["hetrain.config"]


def test_hetrain_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_hetrain_has_no_import_cycle_through_deferred_imports_either():
    cycle = find_cycle(import_graph(deferred=True))
    assert cycle is None, "import cycle (counting imports inside functions): " + " -> ".join(cycle)


@pytest.mark.contract
def test_import_hetrain_and_its_help_import_no_optional_package(processes):
    """The extras (tensorboard, wandb, mlflow, ray) are imported only when a run asks for them (--log,
    --launcher ray)."""
    import subprocess
    import sys

    probe = ("import sys, hetrain\n"
             "from hetrain.cli import main\n"
             "for argv in (['--help'], ['train', '--help'], ['compare', '--help']):\n"
             "    try:\n"
             "        main(argv)\n"
             "    except SystemExit:\n"
             "        pass\n"
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'tensorboard', 'wandb', 'mlflow', 'ray'}))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"


# ----- the layers (issue 39): which package may import which, counting imports inside functions -----
# A package is listed with what it may import besides itself. Bottom to top: the foundation (errors and
# small pure helpers), the pure logic and specs (protocols, comm, the compression and link specs), the
# wire (transport), codecs (compression) and logging sinks (loggers), group services (groups), the
# protocol shells (runtime), then what drives them (launcher, simulator, planner, config), and at the top
# the framework adapters (integrations), the commands and the CLI.
FOUNDATION = {"hetrain", "errors", "topology", "slowdown", "faults", "outputs", "extras"}
PURE_SPECS = {"hetrain.compression.spec", "hetrain.transport.link_spec"}
MAY_IMPORT = {
    "protocols": FOUNDATION,
    "comm": FOUNDATION | {"protocols"} | PURE_SPECS,
    "transport": FOUNDATION,
    "compression": FOUNDATION,
    "loggers": FOUNDATION | {"protocols"},
    "groups": FOUNDATION | {"protocols", "comm", "transport", "compression"},
    "runtime": FOUNDATION | {"protocols", "comm", "transport", "compression", "groups", "loggers"},
}
ABOVE_ALL = {"integrations", "commands", "cli", "__main__", "ray"}  # nothing below them imports them
# (hetrain.ray, the Ray launcher, sits on the local launcher and the training app: hetrain.jobs never imports it)


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "hetrain"


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports that run against the layers: 'importer -> imported' for each."""
    found = []
    for module, targets in sorted(graph.items()):
        package = _package(module)
        for target in sorted(targets):
            other = _package(target)
            if other == package:
                continue
            if other in ABOVE_ALL and package not in ABOVE_ALL | {"testing"}:
                found.append(f"{module} -> {target}")
            elif package in MAY_IMPORT and other not in MAY_IMPORT[package] and target not in MAY_IMPORT[package]:
                found.append(f"{module} -> {target}")
    return found


def test_packages_import_only_the_layers_below_them():
    violations = layer_violations(import_graph(deferred=True))
    assert not violations, "imports against the layers (tests/test_import_graph.py, MAY_IMPORT): " + \
        "; ".join(violations)


def test_the_layer_check_sees_an_arrow_back_up():
    graph = {"hetrain.transport.peer_channels": {"hetrain.runtime.protocol"},
             "hetrain.runtime.protocol": {"hetrain.integrations.protocol_logger"},
             "hetrain.comm.settings": {"hetrain.compression.spec", "hetrain.compression.codecs"},
             "hetrain.groups.preduce": {"hetrain.transport.job"}}
    assert layer_violations(graph) == ["hetrain.comm.settings -> hetrain.compression.codecs",
                                       "hetrain.runtime.protocol -> hetrain.integrations.protocol_logger",
                                       "hetrain.transport.peer_channels -> hetrain.runtime.protocol"]


def test_no_runtime_module_is_a_wire_codec_or_group_service():
    """The shells in hetrain/runtime build no process group and compress nothing themselves."""
    import re

    wire = re.compile(r"\b(new_group|new_subgroups|_new_process_group_helper|ProcessGroupGloo|isend|irecv)\(")
    codec = re.compile(r"^class \w*(Codec|Compressor|Replicas)\b", re.M)
    offending = [path.name for path in (PACKAGE / "runtime").glob("*.py")
                 if wire.search(path.read_text()) or codec.search(path.read_text())]
    assert not offending, offending


@pytest.mark.contract
def test_pure_specs_import_without_torch(processes):
    """The specs the simulator, the CLI and the planner read stay importable without torch."""
    import subprocess
    import sys

    modules = ["hetrain.comm.settings", "hetrain.comm.local_work", *sorted(PURE_SPECS), "hetrain.protocols.hop_logic",
               "hetrain.config"]
    probe = ("import sys\n" + "".join(f"import {m}\n" for m in modules) +
             "print('torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "False"
