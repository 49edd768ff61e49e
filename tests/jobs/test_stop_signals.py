"""The launcher's stop signals in-process: what the first and the second SIGINT/SIGTERM do in each phase.

The commands end to end (a real `hetrain train` stopped by SIGTERM in start-up, in training, with its
warm server signalled too) are in tests/jobs/test_soundness.py.
"""

import os
import signal
import threading

import pytest

from hetrain.commands.train import interrupted_exit_code
from hetrain.errors import Terminated
from hetrain.jobs.interrupts import (
    StopSignals,
    forget_stops,
    held_after_the_job,
    held_while_writing,
    stop_on_sigterm,
    stop_received,
)


@pytest.fixture(autouse=True)
def _signals_restored():
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    forget_stops()
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    forget_stops()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_first_signal_asks_the_workers_to_stop_and_the_second_kills(sig, capfd):
    stop = threading.Event()
    with StopSignals(stop, grace_s=5) as signals:
        os.kill(os.getpid(), sig)
        assert stop.is_set() and signals.received == signal.Signals(sig).name
        assert not signals.overdue(0.0) and signals.deadline is not None
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), sig)
    assert stop_received() == signal.Signals(sig).name
    assert "stopping the workers at their next iteration" in capfd.readouterr().err
    assert signal.getsignal(sig) is not signals._on_signal  # put back as it was


def test_a_signal_while_the_record_is_written_lets_it_be_written_and_is_remembered(capfd):
    with held_while_writing():
        os.kill(os.getpid(), signal.SIGTERM)  # no exception: the record is still written
        written = True
    assert written and stop_received() == "SIGTERM"
    assert "writing the run's record (SIGTERM again to leave now)" in capfd.readouterr().err
    assert interrupted_exit_code([{"interrupted": False}]) == 143  # the run was whole; the shell still learns it
    with pytest.raises(KeyboardInterrupt), held_while_writing():
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)


def test_a_second_sigterm_leaves_as_sigterm_not_as_ctrl_c():
    """Two SIGTERMs (a scheduler's stop, then its kill escalated by hand) end the command with 143, not 130."""
    with pytest.raises(Terminated), StopSignals(threading.Event(), grace_s=5):
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(Terminated), held_while_writing():
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)


def test_around_a_job_a_stop_in_start_up_leaves_and_one_after_its_watch_loop_is_held(capfd):
    """run_training holds stop signals from its start to its record's end: before the job's watch loop
    began a SIGTERM leaves at once (start-up); from the loop's end on, at no moment between the loop and
    the record does one find the command unprotected."""
    stop_on_sigterm()
    with pytest.raises(Terminated), held_after_the_job():
        os.kill(os.getpid(), signal.SIGTERM)  # start-up: no watch loop yet
    forget_stops()
    with held_after_the_job():
        with StopSignals(threading.Event(), grace_s=5):  # the job's watch loop, which ends normally
            pass
        os.kill(os.getpid(), signal.SIGTERM)  # between the loop and the record: held
        written = True
    assert written and stop_received() == "SIGTERM"
    assert "writing the run's record" in capfd.readouterr().err
    assert signal.getsignal(signal.SIGTERM).__name__ == "_raise_terminated"  # put back as it was


def test_a_job_whose_workers_never_poll_the_stop_ends_at_the_first_signal():
    """The planner's jobs (stoppable=False) do not wait out their work on a first Ctrl-C or SIGTERM."""
    with pytest.raises(Terminated), StopSignals(threading.Event(), grace_s=5, stoppable=False):
        os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), StopSignals(threading.Event(), grace_s=5, stoppable=False):
        os.kill(os.getpid(), signal.SIGINT)


def test_outside_a_job_sigterm_leaves_as_ctrl_c_does():
    stop_on_sigterm()
    with pytest.raises(Terminated):
        os.kill(os.getpid(), signal.SIGTERM)
    assert stop_received() == "SIGTERM"


def test_exit_codes_follow_the_shell_convention():
    assert interrupted_exit_code([]) == 0
    assert interrupted_exit_code([{"interrupted": False}, {"interrupted": False}]) == 0
    assert interrupted_exit_code([{"interrupted": True, "interrupted_by": "SIGTERM"}]) == 143
    assert interrupted_exit_code([{"interrupted": True, "interrupted_by": "SIGINT"}]) == 130
    assert interrupted_exit_code([{"interrupted": True}]) == 130  # a record from before interrupted_by


def test_a_stop_in_a_later_run_s_start_up_still_summarizes_the_runs_before_it(processes, tmp_path, monkeypatch):
    """`hetrain compare`: a SIGTERM (or Ctrl-C) while the second protocol starts ends the comparison, and the
    first protocol's run is compared in summary.json and summary.md, not lost with the second."""
    import json

    from hetrain.comparison import run_comparison
    from hetrain.config import RunConfig
    from hetrain.jobs import run

    real_run_training, calls = run.run_training, []

    def second_run_stopped_in_start_up(config, *args, **kwargs):
        calls.append(config.protocol)
        if len(calls) == 2:
            raise Terminated
        return real_run_training(config, *args, **kwargs)

    monkeypatch.setattr(run, "run_training", second_run_stopped_in_start_up)
    base = RunConfig(num_workers=2, compute_ms=5.0, time_budget_s=1.5)
    configs = [base.replace(protocol="hop"), base.replace(protocol="dpsgd"), base.replace(protocol="prague")]
    with pytest.raises(Terminated):
        run_comparison(configs, str(tmp_path / "cmp"), progress=False)
    assert calls == ["hop", "dpsgd"]
    assert (tmp_path / "cmp" / "summary.json").exists(), "the first protocol's run was not summarized"
    summary = json.loads((tmp_path / "cmp" / "summary.json").read_text())
    assert [r["protocol"] for r in summary["runs"]] == ["hop"]
    assert "| hop |" in (tmp_path / "cmp" / "summary.md").read_text()
    assert (tmp_path / "cmp" / "over_time.png").exists()


def test_a_sigterm_as_the_record_is_written_lets_it_be_written_and_the_comparison_stops(processes, tmp_path, monkeypatch):
    """A scheduler's stop that comes after the workers ended (here: as the first protocol's record is
    begun) lets that record and the summary be written, and no further protocol is run."""
    import json

    from hetrain.comparison import run_comparison
    from hetrain.config import RunConfig
    from hetrain.jobs import run

    real_finalize, finalized = run.finalize_run, []

    def stopped_as_it_begins(*args, **kwargs):
        finalized.append(True)
        os.kill(os.getpid(), signal.SIGTERM)  # without the hold: Terminated (stop_on_sigterm below), no record
        return real_finalize(*args, **kwargs)

    monkeypatch.setattr(run, "finalize_run", stopped_as_it_begins)
    stop_on_sigterm()
    base = RunConfig(num_workers=2, compute_ms=5.0, time_budget_s=1.5)
    try:
        summary = run_comparison([base.replace(protocol="hop"), base.replace(protocol="dpsgd")],
                                 str(tmp_path / "cmp"), progress=False)
    except Terminated:
        raise AssertionError("a SIGTERM as the record was begun ended the comparison, the record unwritten") from None
    assert len(finalized) == 1 and stop_received() == "SIGTERM"
    assert [r["protocol"] for r in summary["runs"]] == ["hop"]
    assert summary["runs"][0].get("stopped_after_the_job") == "SIGTERM"  # a library caller learns it too
    assert not summary["runs"][0]["interrupted"]  # the run itself was whole
    assert json.loads((tmp_path / "cmp" / "hop" / "metrics.json").read_text())["protocol"] == "hop"
    assert not (tmp_path / "cmp" / "dpsgd").exists()
