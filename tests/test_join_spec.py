"""``--join``: when new workers join a job that may grow (hetrain.join_spec), and the run's checks."""

import pytest

from hetrain.config import RunConfig
from hetrain.errors import UsageError
from hetrain.join_spec import parse_join


def test_joins_are_read_in_time_order_with_or_without_the_unit():
    spec = parse_join("2@30s, 1@10")
    assert spec.events == ((10.0, 1), (30.0, 2)) and spec.total == 3
    assert parse_join("none").events == () and parse_join(None).total == 0


@pytest.mark.parametrize("text", ["2@", "@5s", "0@5s", "two@5s", "2@5m", "2@-1s", "2"])
def test_a_malformed_join_names_the_forms(text):
    with pytest.raises(UsageError, match=r"--join: cannot read .* use none or K@Ts"):
        parse_join(text)


def test_joins_need_a_job_that_can_grow_and_may_outnumber_its_room():
    assert parse_join("2@5s").check_room(2, 4).total == 2
    assert parse_join("2@5s").check_room(3, 4).total == 2  # the second waits for a rank a worker leaves
    with pytest.raises(UsageError, match="cannot grow"):
        parse_join("1@5s").check_room(3, None)
    with pytest.raises(UsageError, match="cannot grow"):
        parse_join("1@5s").check_room(3, 3)


def test_a_job_that_may_grow_holds_its_largest_size_as_its_ranks():
    config = RunConfig(protocol="hop", num_workers=2, max_workers=6, join="4@8s", time_budget_s=5).validate()
    assert config.world_size == 6 and config.elastic
    assert config.worker_on_failure() == "respawn"  # a joining worker is admitted as a replacement is
    fixed = RunConfig(protocol="hop", num_workers=2, time_budget_s=5, on_failure="abort").validate()
    assert fixed.world_size == 2 and not fixed.elastic
    # the launcher aborts on a death, yet the workers route around one that leaves gracefully
    assert fixed.worker_on_failure() == "continue"
    assert RunConfig(protocol="allreduce", num_workers=2, time_budget_s=5).worker_on_failure() == "abort"
