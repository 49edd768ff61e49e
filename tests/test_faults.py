"""--fail specs at every phase and kind (issue 25): parsing, bad input, what the simulator refuses."""

import pytest

from hetrain.cli import main
from hetrain.errors import UsageError
from hetrain.faults import Fault, parse_fail
from hetrain.jobs.fault_injection import FaultSchedule
from hetrain.jobs.heartbeat import SilenceWatch


@pytest.mark.parametrize("text, fault", [
    ("3@20s", Fault(3, "train", 20.0)),
    ("3@20", Fault(3, "train", 20.0)),
    ("3@20s:stop", Fault(3, "train", 20.0, signal="stop")),
    ("2@wall:12s", Fault(2, "wall", 12.0)),
    ("2@wall:1.5s:stop", Fault(2, "wall", 1.5, signal="stop")),
    ("1@startup", Fault(1, "phase", phase="startup")),
    ("1@connect:kill", Fault(1, "phase", phase="connect")),
    ("0@checkpoint", Fault(0, "phase", phase="checkpoint")),
    ("4@finish:stop", Fault(4, "phase", phase="finish", signal="stop")),
])
def test_each_form_parses_to_its_fault(text, fault):
    spec = parse_fail(text)
    assert spec.events == (fault,)
    assert spec.fixed == (((fault.at_s, fault.worker),) if fault.clock == "train" and fault.signal == "kill" else ())
    assert parse_fail(fault.describe()).events == (fault,)  # the description is a spec too


@pytest.mark.parametrize("text", ["3@soon", "3@20s:pause", "3@wall:", "x@startup", "3@startup:stop:stop"])
def test_malformed_specs_name_the_accepted_forms(text):
    with pytest.raises(UsageError, match="W@PHASE"):
        parse_fail(text)


def test_schedule_fires_each_fault_once_at_its_moment():
    schedule = FaultSchedule([Fault(1, "train", 2.0), Fault(2, "wall", 5.0), Fault(3, "phase", phase="finish")])
    assert schedule.due(None, 1.0, {}) == []  # no training yet
    assert schedule.due(2.5, 1.5, {3: {"startup"}}) == [Fault(1, "train", 2.0)]
    assert schedule.due(2.6, 5.0, {3: {"startup", "connect"}}) == [Fault(2, "wall", 5.0)]
    assert schedule.due(9.0, 9.0, {3: {"finish"}}) == [Fault(3, "phase", phase="finish")]
    assert schedule.due(99.0, 99.0, {3: {"finish"}}) == []


def test_silence_watch_names_the_silent_only_past_the_timeout(monkeypatch):
    import types

    import hetrain.jobs.heartbeat as heartbeat

    now = [100.0]  # a fake clock: what the watch sees does not hang on the test's own scheduling
    monkeypatch.setattr(heartbeat, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    watch = SilenceWatch(timeout_s=0.05)
    watch.started(0)
    watch.started(1)
    now[0] += 0.08
    watch.heard(1)
    assert list(watch.silent([0, 1])) == [0]
    assert SilenceWatch(timeout_s=0).silent([0, 1]) == {}  # 0: off


@pytest.mark.parametrize("spec", ["2@startup", "2@wall:3s", "2@5s:stop"])
def test_simulate_refuses_what_it_does_not_model(capsys, tmp_path, spec):
    code = main(["simulate", "--protocol", "hop", "--workers", "8", "--iterations", "20", "--fail", spec,
                 "--on-failure", "continue", "--out", str(tmp_path / "sim")])
    assert code == 2
    err = capsys.readouterr().err
    assert "training clock only" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "sim").exists()


def test_train_rejects_a_negative_heartbeat_timeout(capsys, tmp_path):
    assert main(["train", "--iterations", "2", "--heartbeat-timeout", "-1", "--out", str(tmp_path / "x")]) == 2
    assert "--heartbeat-timeout" in capsys.readouterr().err
