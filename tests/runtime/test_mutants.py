"""The protocol tests can fail: under a mutant whose workers never take anything from communication,
every multi-process protocol test must fail on one of its own assertions (slow set).

The mutant (:mod:`hetrain.testing.mutants`) keeps every message flowing, so a test cannot "fail" by
hanging or by a worker error: each must fail because its assertion on mixing, consensus or
the averaged gradient does not hold.
"""

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from hetrain.testing.mutants import ENV

ROOT = Path(__file__).resolve().parents[2]
# every test of a protocol's mixing; the failure-handling tests there (a stalled or dead worker fails
# the job) are about errors, not mixing, and pass under the mutant as they should
PROTOCOL_TESTS = [
    "tests/runtime/test_protocols_mp.py::test_ring_average_known_answer",
    "tests/runtime/test_protocols_mp.py::test_averaging_preserves_the_mean_and_contracts_before_finish",
    "tests/runtime/test_protocols_mp.py::test_hop_straggler_skips_and_fast_workers_do_not_wait_for_it",
    "tests/runtime/test_protocols_mp.py::test_allreduce_is_ddp_and_workers_agree_to_stop",
    "tests/runtime/test_group_protocols.py",
    "tests/runtime/test_respawn.py::test_a_replacement_joins_reaches_the_others_and_ends_in_consensus",
]


def _run_under_mutant(tmp_path: Path, mutant: str | None) -> dict[str, str | None]:
    """Run PROTOCOL_TESTS in a child pytest; {test id: None if it passed, else its failure message}."""
    report = tmp_path / f"report-{mutant}.xml"
    env = dict(os.environ)
    env.pop(ENV, None)
    if mutant:
        env[ENV] = mutant
    subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "", "-q",
                    f"--junitxml={report}", *PROTOCOL_TESTS], cwd=ROOT, env=env, capture_output=True, text=True,
                   timeout=900)
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        failed = case.find("failure")
        errored = case.find("error")
        skipped = case.find("skipped")
        if skipped is not None:
            continue
        problem = failed if failed is not None else errored
        outcomes[name] = None if problem is None else (problem.get("message") or "")
    return outcomes


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_every_protocol_test_fails_when_workers_never_communicate(tmp_path):
    mutated = _run_under_mutant(tmp_path, "no-comm")
    assert len(mutated) >= 23, sorted(mutated)  # 6 of test_protocols_mp (with parameters), 12 group, 5 respawn
    passed = [name for name, message in mutated.items() if message is None]
    assert not passed, f"these pass with no communication at all, so they test none: {passed}"
    not_assertions = {name: message[:200] for name, message in mutated.items()
                      if not message.startswith(("AssertionError", "assert"))}
    assert not not_assertions, f"these failed for another reason than their assertions: {not_assertions}"
