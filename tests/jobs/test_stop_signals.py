"""The launcher's stop signals in-process: what the first and the second SIGINT/SIGTERM do in each phase.

The commands end to end (a real `hetrain train` stopped by SIGTERM in start-up, in training, with its
warm server signalled too) are in tests/runtime/test_soundness.py.
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
