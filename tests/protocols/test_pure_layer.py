"""The pure layer imports no torch, the simulator runs every protocol without it, and the
parameter server's rules (shared by runtime and simulator) behave as documented."""

import pkgutil
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hetrain.protocols
from hetrain.protocols.options import OptionError
from hetrain.protocols.ps_logic import ParameterServerLogic, PSOptions
from hetrain.registry import PROTOCOL_NAMES, get_spec

BLOCK_TORCH = textwrap.dedent("""
    import importlib.abc, sys
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError("torch is blocked in this test: " + name)
    sys.meta_path.insert(0, Block())
""")


def _run_without_torch(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH + textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.contract
def test_the_pure_layer_and_the_registry_import_without_torch(processes):
    modules = [f"hetrain.protocols.{m.name}" for m in pkgutil.iter_modules(hetrain.protocols.__path__)]
    assert "hetrain.protocols.group_generator" in modules and "hetrain.protocols.ps_logic" in modules
    result = _run_without_torch(f"""
        import importlib
        for name in {modules + ["hetrain.registry", "hetrain.sim.network", "hetrain.sim.runner"]!r}:
            importlib.import_module(name)
        print("ok")
    """)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_the_blocker_does_block_torch(processes):
    result = _run_without_torch("import hetrain.runtime.hop")
    assert result.returncode != 0 and "torch is blocked" in result.stderr


def test_simulate_runs_every_protocol_without_torch(processes, tmp_path):
    result = _run_without_torch(f"""
        from hetrain.cli import main
        for protocol in {list(PROTOCOL_NAMES)!r}:
            code = main(["simulate", "--protocol", protocol, "--workers", "8", "--iterations", "10",
                         "--slowdown", "0:5x", "--math", "none", "--no-progress", "--out", {str(tmp_path)!r} + "/" + protocol])
            assert code == 0, protocol
        print("ok")
    """)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-2000:]


def test_every_spec_names_an_options_class_with_one_validate():
    for name in PROTOCOL_NAMES:
        spec = get_spec(name)
        options = spec.make_options({}, num_workers=8)
        assert options.validate(8) == options
        for field in spec.option_names():
            assert getattr(options, field) is not None or field in ("backup", "staleness", "max_ig",
                                                                      "skip_threshold", "workers_per_node")


def test_options_errors_name_python_arguments_and_the_cli_shows_flags():
    with pytest.raises(OptionError) as info:
        get_spec("prague").make_options({"group_size": 9}, num_workers=4)
    assert str(info.value).startswith("group_size must be between 1 and")
    assert info.value.for_cli().startswith("--group-size must be between 1 and")


# ----- the parameter server's rules --------------------------------------------------------

def test_synchronous_rounds_wait_for_every_active_worker_and_apply_the_mean():
    logic = ParameterServerLogic(3, staleness=0)
    assert logic.push(0, "a").answer == [] and logic.push(2, "c").answer == []
    assert logic.waiting_for() == [1]
    step = logic.push(1, "b")
    assert step.apply == ["a", "b", "c"] and step.weight == pytest.approx(1 / 3) and step.answer == [0, 1, 2]


def test_a_worker_that_leaves_is_no_longer_waited_for():
    logic = ParameterServerLogic(3, staleness=0)
    logic.push(0, "a")
    logic.push(1, "b")
    step = logic.leave(2)
    assert step.apply == ["a", "b"] and step.weight == pytest.approx(1 / 2) and step.answer == [0, 1]
    with pytest.raises(ValueError):
        logic.push(2, "late")


def test_a_worker_that_joins_is_waited_for_from_its_next_push_and_counted_as_far_as_the_slowest():
    logic = ParameterServerLogic(3, staleness=0)
    logic.leave(2)  # vacant from the start
    logic.push(0, "a")
    assert logic.join(2).answer == [] and logic.waiting_for() == [1, 2]  # this round waits for it too
    logic.push(1, "b")
    step = logic.push(2, "zeros")  # its first push: nothing, answered with the global model
    assert step.apply == ["a", "b", "zeros"] and step.answer == [0, 1, 2]
    held = ParameterServerLogic(3, staleness=1)
    held.leave(2)
    for _ in range(3):
        held.push(0, "a")
        held.push(1, "b")
    held.join(2)  # at the slowest's 3 pushes: it holds no one back, and the staleness bound counts it
    assert held.pushes[2] == 3 and held.push(0, "a").answer == [0]
    assert held.push(0, "a").answer == []  # 5 against the new worker's 3: held


def test_asynchronous_pushes_apply_at_once_and_hold_workers_too_far_ahead():
    logic = ParameterServerLogic(2, staleness=1)
    step = logic.push(0, "a")
    assert step.apply == ["a"] and step.weight == pytest.approx(1 / 2) and step.answer == [0]  # 1 ahead: ok
    assert logic.push(0, "a2").answer == []  # 2 ahead of worker 1: held
    step = logic.push(1, "b")  # the slowest catches up to within 1: worker 0 and 1 answered
    assert sorted(step.answer) == [0, 1]
    assert logic.push(0, "a3").answer == []  # 3 pushes against 1: held again (it waits for its answer)
    assert logic.leave(1).answer == [0]  # the slowest left: nothing to wait for


class _ScanningServer:
    """The server's rules as first written: every push scans all workers (the reference)."""

    def __init__(self, n, staleness):
        self.n, self.s, self.pushes, self.left, self.round, self.held = n, staleness, [0] * n, set(), {}, []

    def active(self):
        return set(range(self.n)) - self.left

    def push(self, w, payload):
        self.pushes[w] += 1
        if self.s == 0:
            self.round[w] = payload
            return self.close()
        self.held.append(w)
        return self.release()

    def leave(self, w):
        self.left.add(w)
        return self.close() if self.s == 0 else self.release()

    def close(self):
        if not self.round or not self.active() <= set(self.round):
            return []
        workers = sorted(self.round)
        self.round.clear()
        return workers

    def release(self):
        slowest = min((self.pushes[w] for w in self.active()), default=0)
        answer = [w for w in self.held if w in self.left or self.pushes[w] - slowest <= self.s]
        self.held = [w for w in self.held if w not in answer]
        return answer


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(1, 8), staleness=st.integers(0, 3))
def test_ps_rules_answer_what_a_full_scan_answers(data, n, staleness):
    """The server keeps its round, slowest count and held answers up to date (O(log n) per push);
    driven like a worker pool (a worker pushes again only once answered, may leave while held),
    it answers exactly whom, and in the order, the scanning reference does."""
    logic, ref = ParameterServerLogic(n, staleness), _ScanningServer(n, staleness)
    waiting, left = set(), set()
    for _ in range(data.draw(st.integers(1, 60))):
        idle = [w for w in range(n) if w not in waiting and w not in left]
        live = [w for w in range(n) if w not in left]
        if not live:
            break
        if idle and data.draw(st.booleans()):
            w = data.draw(st.sampled_from(idle))
            got, want = logic.push(w, w).answer, ref.push(w, w)
            waiting.add(w)
        else:
            w = data.draw(st.sampled_from(live))
            got, want = logic.leave(w).answer, ref.leave(w)
            left.add(w)
        assert got == want
        waiting -= set(got)


def test_ps_options_reject_negative_staleness():
    with pytest.raises(OptionError, match="staleness must be >= 0"):
        PSOptions(-1).validate(4)


def test_a_server_restored_from_a_checkpoints_push_counts_goes_on_from_them():
    """--resume of a ps job: the server starts from the counts it saved (they once lost their index)."""
    from hetrain.protocols.ps_logic import ParameterServerLogic

    logic = ParameterServerLogic(3, staleness=1)
    logic.restore_pushes([78, 75, 77])
    assert logic.push(1, "d1").answer == [1]  # 76 pushes: it is the slowest
    assert logic.push(0, "d0").answer == []  # 79: three ahead of the slowest (76), held
    assert logic.push(1, "d1").answer == [1]  # 77: the slowest is now 77, so 78 is the limit; 0 still held
    assert logic.push(2, "d2").answer == [2]  # 78: within the limit; worker 0 (79) still waits
    assert logic.push(1, "d1").answer == [0, 1]  # the slowest reaches 78: 0 is released, first held first
    assert logic.pushes == [79, 78, 78]
    synchronous = ParameterServerLogic(2, staleness=0)
    synchronous.restore_pushes([10, 9])
    assert synchronous.push(0, "a").answer == [] and synchronous.push(1, "b").answer == [0, 1]
    assert synchronous.pushes == [11, 10]
