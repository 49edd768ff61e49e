import pytest

from hetrain.errors import UsageError
from hetrain.slowdown import parse_slowdown


def test_none_and_fixed():
    assert parse_slowdown("none").factor(3, 10) == 1.0
    s = parse_slowdown("2:5x,0:1.5")
    assert [s.factor(w, 0) for w in range(3)] == [1.5, 1.0, 5.0]
    assert s.is_deterministic() and s.expected_factor(2) == 5.0


def test_every_nth_worker():
    s = parse_slowdown("every:4:3x")
    assert [s.factor(w, 7) for w in range(9)] == [3.0, 1, 1, 1, 3.0, 1, 1, 1, 3.0]
    with pytest.raises(UsageError, match="every:N:Kx"):
        parse_slowdown("every:4")


def test_random_is_deterministic_and_has_the_right_rate():
    s = parse_slowdown("random:p=0.1,factor=6", seed=3)
    draws = [s.factor(w, it) for w in range(8) for it in range(2000)]
    assert draws == [parse_slowdown("random:p=0.1,factor=6", seed=3).factor(w, it)
                     for w in range(8) for it in range(2000)]
    assert set(draws) == {1.0, 6.0}
    assert draws.count(6.0) / len(draws) == pytest.approx(0.1, abs=0.01)
    assert s.expected_factor(0) == pytest.approx(1.5)
    assert not s.is_deterministic()


def test_trace_file(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("worker,iteration,factor\n1,0,3\n1,2,4.5\n")
    s = parse_slowdown(f"trace:{path}")
    assert [s.factor(1, it) for it in range(4)] == [3.0, 1.0, 4.5, 1.0]
    assert s.factor(0, 0) == 1.0


@pytest.mark.parametrize("spec", ["2:fast", "2", "x:5x", "-1:5x", "1:0.5x", "random:p=2,factor=3",
                                  "random:p=0.1", "random:q=0.1,factor=2", "trace:/nonexistent.csv"])
def test_malformed_specs_are_one_line_errors(spec):
    with pytest.raises(UsageError) as info:
        parse_slowdown(spec)
    assert "\n" not in str(info.value)


def test_bad_trace_rows(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("worker,iteration,factor\n1,zero,3\n")
    with pytest.raises(UsageError, match="line 2"):
        parse_slowdown(f"trace:{path}")


def test_worker_out_of_range():
    with pytest.raises(UsageError, match="names worker 9"):
        parse_slowdown("9:5x").check_workers(8)
