"""scripts/gpu-check's driver on the CPU: what it reports and its exit code, whatever the checks find.

A check that could not run is "not checked", never passed; the exit code is 0 only when every required
check ran and passed and none failed. (The checks themselves need a GPU: hetrain/testing/gpu_checks.py.)
"""

import pytest

from hetrain.testing import gpu_check, gpu_checks
from hetrain.testing.gpu_check import CHECKS, FAILED, NOT_CHECKED, OK, Check, Result, classify, exit_code
from hetrain.testing.gpu_check import table as report_table


def _results(*statuses):
    return [Result(f"c{i}", status, "why", required) for i, (status, required) in enumerate(statuses)]


@pytest.mark.parametrize("statuses, code", [
    (((OK, True), (OK, True)), 0),
    (((OK, True), (NOT_CHECKED, False)), 0),  # an optional check that needs two GPUs
    (((OK, True), (NOT_CHECKED, True)), 1),  # a required check that did not run is no pass
    (((OK, True), (FAILED, False)), 1),  # nor is a failed optional one
    (((FAILED, True),), 1),
])
def test_the_exit_code_is_zero_only_when_every_required_check_passed_and_none_failed(statuses, code):
    assert exit_code(_results(*statuses)) == code


def test_the_table_says_not_checked_and_why_never_ok():
    report = report_table([Result("a", OK, "fine", True), Result("b", NOT_CHECKED, "needs 2 GPUs, this machine has 1",
                                                          False), Result("c", FAILED, "differs | here", True)])
    assert "| a | ok | yes |" in report and "| b | not checked (needs 2 GPUs, this machine has 1) | no |" in report
    assert "| c | FAILED | yes | 0 s | differs / here |" in report
    assert report.splitlines()[-1] == "NOT PASSED: c FAILED"


def test_a_checks_process_is_classified_by_its_exit_code():
    assert classify(0, "6 x 64 MB exact") == (OK, "6 x 64 MB exact")
    assert classify(gpu_check.NOT_CHECKED_EXIT, "no CUDA device") == (NOT_CHECKED, "no CUDA device")
    assert classify(1, "AssertionError: worker 1: a payload differs") == (FAILED, "AssertionError: worker 1: a "
                                                                                   "payload differs")
    assert classify(None, "") == (FAILED, "no result within its timeout")


def test_without_cuda_every_check_is_not_checked_and_the_exit_code_is_one(tmp_path):
    def runner(check):
        raise AssertionError(f"{check.name} ran on a machine without CUDA")

    assert gpu_check.main(["--out", str(tmp_path)], runner=runner, gpus=0) == 1
    summary = (tmp_path / "summary.md").read_text()
    assert summary.count("not checked (no CUDA device)") == len(CHECKS) and "| ok |" not in summary


def test_on_one_gpu_the_two_gpu_checks_are_not_checked_and_a_failure_fails(tmp_path):
    ran = []

    def passing(check):
        ran.append(check.name)
        return OK, "fine"

    assert gpu_check.main(["--out", str(tmp_path)], runner=passing, gpus=1) == 0
    assert ran == [c.name for c in CHECKS if c.gpus == 1]
    assert (tmp_path / "summary.md").read_text().count("not checked (needs 2 GPUs, this machine has 1)") == 3
    failing = lambda check: (FAILED, "differs") if check.name == "staged-transfer-64mb" else (OK, "")  # noqa: E731
    assert gpu_check.main(["--out", str(tmp_path)], runner=failing, gpus=1) == 1


def test_every_check_has_a_body_and_the_required_ones_need_one_gpu():
    for check in CHECKS:
        assert callable(getattr(gpu_checks, check.name.replace("-", "_"))), check.name
        assert check.gpus == 1 or not check.required, check.name


def test_a_check_run_as_a_process_here_reports_not_checked(processes, tmp_path):
    """The real path: a process per check; on this machine it cannot run, and says so."""
    status, detail = gpu_check.subprocess_runner(tmp_path)(Check("staged-transfer-64mb", "", timeout_s=120))
    assert (status, detail) == (NOT_CHECKED, "no CUDA device")
