"""The suite's tiers, by what a test starts (docs/guides/testing.md).

- ``unit``: starts no process and opens no socket (an in-memory ``HashStore`` is fine). Every test is
  this tier unless it takes one of the fixtures below.
- ``inprocess``: opens sockets, stores or gloo groups inside the test process (thread ranks, a TCPStore,
  the fake transport over loopback): the test takes the ``loopback`` fixture.
- ``process``: starts processes (a local job, the CLI in a subprocess, torchrun, Ray): the test takes the
  ``processes`` fixture, which kills whatever the test started and left running.

The marks are set from those fixtures at collection, and a guard checks them as the test runs: a test
that starts a process without ``processes``, or opens a socket without ``loopback``, fails, naming the
fixture to take. ``scripts/test --quick`` runs the first two tiers.

A process test is ``slow`` (``scripts/test -m slow``) unless it is marked ``contract``: it guards a
contract no faster test can (a real SIGKILL, torchrun, the launcher's start-up), one or two per family.
"""

from __future__ import annotations

import multiprocessing.process
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

TIERS = ("unit", "inprocess", "process")


def pytest_configure(config):
    """The tier marks; and a mutant named by $HETRAIN_MUTANT applies to the test process too, so the tests
    that run in-process (codecs, weights, the resume check) see it as the workers do."""
    for tier, text in (("unit", "starts no process, opens no socket (the default)"),
                       ("inprocess", "sockets, stores or gloo groups in the test process (the loopback fixture)"),
                       ("process", "starts processes (the processes fixture)"),
                       ("contract", "a process test in the default run: it guards what no faster test can")):
        config.addinivalue_line("markers", f"{tier}: {text}")
    sys.path.append(str(Path(__file__).parent / "support"))  # the tests' own helpers (doc_blocks, hostile_peer)
    _mutant_in_every_process()


MUTANT_SITE = str(Path(__file__).parent / "mutants" / "site")  # its sitecustomize applies $HETRAIN_MUTANT


def _mutant_in_every_process() -> None:
    """With $HETRAIN_MUTANT set (the mutant meta-test's runs, or by hand), the mutant applies here and, through
    ``PYTHONPATH``, in every process the tests start (tests/mutants/catalog.py)."""
    if not os.environ.get("HETRAIN_MUTANT"):
        return
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if MUTANT_SITE not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [MUTANT_SITE, *paths] if p)
    sys.path.append(str(Path(MUTANT_SITE).parent))
    from catalog import apply_from_env

    apply_from_env()


def tier_of(item) -> str:
    fixtures = set(getattr(item, "fixturenames", ()))
    return "process" if "processes" in fixtures else "inprocess" if "loopback" in fixtures else "unit"


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = tier_of(item)
        item.add_marker(getattr(pytest.mark, tier))
        if tier == "process" and item.get_closest_marker("contract") is None:
            item.add_marker(pytest.mark.slow)
    # the tests given the longest timeouts first, so that pytest-xdist runs them beside the others, not after
    # them: the Ray launcher's test (2 min under two CPU burners, most of it its actors' start), collected
    # late, ran alone at the end of the CI
    default_s = float(config.getini("timeout") or 0)
    items.sort(key=lambda item: -_timeout_s(item, default_s))  # stable: the others keep their order


def _timeout_s(item, default_s: float) -> float:
    marker = item.get_closest_marker("timeout")
    return float(marker.args[0]) if marker and marker.args else default_s


# ----- the guard: a test's tier is what it does --------------------------------------------------------------
class TierViolation(AssertionError):
    pass


def _refuse(what: str, fixture: str):
    def refuse(*args, **kwargs):
        raise TierViolation(f"this test {what}: take the `{fixture}` fixture (tests/conftest.py) so that "
                            f"its tier says so")

    return refuse


@pytest.fixture(autouse=True)
def _tier_guard(request, monkeypatch):
    tier = tier_of(request.node)
    if tier != "process":
        starts = _refuse("starts a process", "processes")
        monkeypatch.setattr(subprocess.Popen, "__init__", starts)
        monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", starts)
        monkeypatch.setattr(os, "fork", starts)
    if tier == "unit":
        import torch.distributed as dist

        opens = _refuse("opens a socket, a TCP store or a gloo group", "loopback")
        for name in ("bind", "connect", "connect_ex"):
            monkeypatch.setattr(socket.socket, name, opens)
        for name in ("TCPStore", "ProcessGroupGloo"):
            if hasattr(dist, name):
                monkeypatch.setattr(dist, name, opens)
    yield


# ----- the tiers' fixtures -----------------------------------------------------------------------------------
@pytest.fixture
def loopback():
    """This test opens sockets, stores or gloo groups in its own process (tier ``inprocess``)."""
    return None


@pytest.fixture
def no_warm_server(monkeypatch):
    """Workers start by spawn, so a command refused before its workers start starts no process at all
    (the warm server is started early, beside the launcher's own imports: hetrain.jobs.warm_start)."""
    from hetrain.jobs.warm_start import START_METHOD_ENV

    monkeypatch.setenv(START_METHOD_ENV, "spawn")


_INFRASTRUCTURE = (b"multiprocessing.forkserver", b"multiprocessing.resource_tracker")


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                state, parent = handle.read().rsplit(")", 1)[1].split()[:2]
        except (OSError, IndexError, ValueError):
            continue
        if state == "Z":  # ended, not yet reaped: nothing left to kill
            continue
        children.setdefault(int(parent), []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _is_infrastructure(pid: int) -> bool:
    """multiprocessing's forkserver and resource tracker: they outlive a job by design and are reused."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command = handle.read()
    except OSError:
        return True
    return any(name in command for name in _INFRASTRUCTURE)


@pytest.fixture
def processes():
    """This test starts processes (tier ``process``). At teardown every process it started and left
    running (a worker, a torchrun agent, a CLI run) is killed, so that none outlives the test."""
    before = _descendants(os.getpid())
    yield
    deadline = time.monotonic() + 5.0
    while True:
        left = {pid for pid in _descendants(os.getpid()) - before if not _is_infrastructure(pid)}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)  # a job's workers end on their own just after it returns
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
