"""The emulated compute phase: each iteration lasts its target as measured in that iteration (a fake clock)."""

import pytest

from hetrain.config import RunConfig
from hetrain.jobs.capacity import standalone_iteration_s
from hetrain.jobs.compute_ledger import ComputeLedger, job_compute_phase, over_target_warning
from hetrain.jobs.emulation import MAX_COMPENSATION, ComputeEmulator
from hetrain.slowdown import parse_slowdown


class FakeClock:
    """A clock that moves only when the test does work or the emulator sleeps (each sleep ``late_s`` late)."""

    def __init__(self, late_s: float = 0.0):
        self.now = 100.0
        self.late_s = late_s
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds + self.late_s


def run_iterations(emulator: ComputeEmulator, clock: FakeClock, works_s: list[float], target_s: float | None,
                   factor: float = 1.0, excluded_s: float = 0.0) -> list[float]:
    """Each iteration's phase as the clock saw it (begin to the end of the sleep)."""
    phases = []
    for work in works_s:
        began = clock.now
        emulator.begin()
        clock.now += work
        emulator.end(target_s, factor, excluded_s)
        phases.append(clock.now - began)
    return phases


def test_a_busy_start_does_not_stick_each_quick_iteration_still_lasts_its_target():
    clock = FakeClock()
    emulator = ComputeEmulator(clock, clock.sleep)
    phases = run_iterations(emulator, clock, [0.078, 0.081, 0.003, 0.004, 0.002, 0.003], target_s=0.05)
    assert phases[:2] == pytest.approx([0.078, 0.081])  # longer than the target: no sleep
    assert phases[2:] == pytest.approx([0.05] * 4)  # quick again: slept the rest, measured that very iteration
    assert list(emulator.ledger.achieved_s) == pytest.approx(phases, rel=1e-5)


def test_the_slowdown_factor_scales_the_target_and_real_compute_sleeps_its_own_work_times_it():
    clock = FakeClock()
    emulator = ComputeEmulator(clock, clock.sleep)
    assert run_iterations(emulator, clock, [0.004, 0.009], target_s=0.05, factor=5.0) == pytest.approx([0.25, 0.25])
    real = ComputeEmulator(clock, clock.sleep)
    assert run_iterations(real, clock, [0.01, 0.03], target_s=None, factor=3.0) == pytest.approx([0.03, 0.09])


def test_a_wait_inside_backward_is_not_work_the_sleep_completes():
    clock = FakeClock()
    emulator = ComputeEmulator(clock, clock.sleep)
    phases = run_iterations(emulator, clock, [0.2], target_s=0.05, excluded_s=0.195)  # DDP: 195 ms waiting
    assert phases == pytest.approx([0.2 + 0.045])
    assert emulator.ledger.work_s[0] == pytest.approx(0.005)


def test_late_wake_ups_are_taken_off_the_next_sleeps_but_never_more_than_a_share_of_the_target():
    clock = FakeClock(late_s=0.002)
    emulator = ComputeEmulator(clock, clock.sleep)
    phases = run_iterations(emulator, clock, [0.002] * 10, target_s=0.05)
    assert phases[0] == pytest.approx(0.052)
    assert phases[-1] == pytest.approx(0.05)  # the median overshoot (2 ms) taken off each request
    clock.late_s = 0.02  # a very busy machine: 20 ms late every time
    phases = run_iterations(emulator, clock, [0.002] * 20, target_s=0.05)
    assert min(phases) >= 0.05 * (1 - MAX_COMPENSATION) - 1e-9  # never shortened below 95% of the target


def test_a_long_math_iteration_is_recorded_over_target_and_a_sustained_share_names_the_worker():
    clock = FakeClock()
    emulator = ComputeEmulator(clock, clock.sleep)
    run_iterations(emulator, clock, [0.002] * 18 + [0.07, 0.09], target_s=0.05)  # two slow iterations: a hiccup
    hiccup = emulator.ledger.summary()
    assert hiccup["share_over_target"] == pytest.approx(0.1) and not hiccup["over_target"]
    assert hiccup["target_ms"] == pytest.approx(50.0) and hiccup["achieved_ms_median"] == pytest.approx(50.0)
    run_iterations(emulator, clock, [0.08] * 10, target_s=0.05)  # now a third of the iterations
    sustained = emulator.ledger.summary()
    assert sustained["share_over_target"] == pytest.approx(12 / 30, abs=1e-4) and sustained["over_target"]
    assert sustained["work_ms_median"] == pytest.approx(2.0, abs=1e-3)
    quick = ComputeEmulator(clock, clock.sleep)
    run_iterations(quick, clock, [0.003] * 30, target_s=0.25)
    workers = [{"rank": 0, "compute_phase": quick.ledger.summary()},
               {"rank": 1, "compute_phase": sustained}]
    job = job_compute_phase(workers)
    assert job["compute_phase_over_target"] == [1]
    warning = over_target_warning({**job, "workers": workers})
    assert "worker 1 (40% of 30 iterations" in warning and "worker 0" not in warning
    assert over_target_warning({"compute_phase_over_target": [], "workers": workers}) is None


def test_the_emulated_standalone_iteration_is_never_shorter_than_the_achieved_phase():
    config = RunConfig(compute_ms=50.0, slowdown="0:5x")
    slowdown = parse_slowdown(config.slowdown)
    assert standalone_iteration_s(config, slowdown, 1, 0.002, 9.0, 100, achieved_s=0.0512) == pytest.approx(0.0512)
    assert standalone_iteration_s(config, slowdown, 0, 0.002, 9.0, 100, achieved_s=0.2495) == pytest.approx(0.25)


def test_the_speed_basis_leaves_out_the_start_s_phases_a_collective_lengthened():
    """A fast worker behind a 5x one under DDP: its second phase held the bucket rebuild's broadcast."""
    ledger = ComputeLedger()
    for achieved in (0.051, 0.212, *[0.050] * 10):
        ledger.record(0.05, achieved, 0.003)
    assert ledger.mean_achieved_s() == pytest.approx(0.050)
    short = ComputeLedger()
    short.record(0.05, 0.06, 0.003)
    assert short.mean_achieved_s() == pytest.approx(0.06)  # a run shorter than the start: what it has


def test_an_empty_ledger_says_so():
    assert ComputeLedger().summary() == {"iterations": 0}
    assert job_compute_phase([{"rank": 0, "compute_phase": {"iterations": 0}}])["compute_phase_ratio_min"] is None


def test_the_warning_names_a_respawned_rank_by_the_process_that_measured_its_phase():
    """Under respawn a rank has two entries, the dead process's (no phase) after or before its replacement's:
    the warning raised KeyError on the one without (the slow suite, a loaded machine, 2026-12-07)."""
    clock = FakeClock()
    slow = ComputeEmulator(clock, clock.sleep)
    run_iterations(slow, clock, [0.08] * 10, target_s=0.05)
    for workers in ([{"rank": 2, "compute_phase": slow.ledger.summary()}, {"rank": 2, "incarnation": 0}],
                    [{"rank": 2, "incarnation": 0}, {"rank": 2, "compute_phase": slow.ledger.summary()}]):
        job = job_compute_phase(workers)
        assert job["compute_phase_over_target"] == [2]
        assert "worker 2 (100% of 10 iterations" in over_target_warning({**job, "workers": workers})
