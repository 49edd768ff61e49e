"""Each Group Generator mode as a strategy object on its own: a ledger, a seeded generator, requests."""

import random

import pytest

from hetrain.protocols.gg_modes import GG_MODES, MODES, GroupingMode
from hetrain.protocols.gg_modes.buffer import BufferMode
from hetrain.protocols.gg_modes.division import DivisionMode
from hetrain.protocols.gg_modes.random_groups import RandomMode
from hetrain.protocols.gg_modes.smart import SMART_WINDOW, SmartMode
from hetrain.protocols.gg_modes.static import StaticMode, static_schedule
from hetrain.protocols.group_generator import GroupGenerator
from hetrain.protocols.ledger import GroupLedger
from hetrain.protocols.options import OptionError


def _mode(cls, n=6, size=2, seed=0, **kwargs):
    ledger = GroupLedger(n)
    return cls.create(ledger, random.Random(seed), size, seed=seed, **kwargs), ledger


def test_the_five_modes_share_one_interface_and_are_named_as_the_flag():
    assert GG_MODES == ("random", "buffer", "division", "static", "smart")
    for name, cls in MODES.items():
        assert issubclass(cls, GroupingMode) and cls.name == name
        mode, _ = _mode(cls)
        assert isinstance(mode.request(0, 0, 0.0), list) and mode.period >= 0


def test_random_forms_a_group_on_every_request_and_hands_over_everything_queued():
    mode, ledger = _mode(RandomMode, n=4)
    first = mode.request(0, 0, 0.0)
    assert len(first) == 1 and 0 in first[0].members and len(first[0].members) == 2
    partner = next(m for m in first[0].members if m != 0)
    mine = mode.request(partner, 0, 0.0)  # the group 0's request made, then partner's own
    assert mine[0] == first[0] and len(mine) == 2 and ledger.groups_formed == 2


def test_random_counts_no_empty_request_when_nobody_is_left_to_group():
    mode, ledger = _mode(RandomMode, n=2)
    mode.leave(1, 0.0)
    assert mode.request(0, 0, 0.0) == [] and mode.empty_requests == 0


def test_buffer_takes_a_queued_group_before_forming_one():
    mode, ledger = _mode(BufferMode, n=4)
    (group,) = mode.request(0, 0, 0.0)
    partner = next(m for m in group.members if m != 0)
    assert mode.request(partner, 0, 0.0) == [group] and ledger.groups_formed == 1


def test_buffer_counts_an_empty_answer():
    mode, _ = _mode(BufferMode, n=2)
    mode.leave(1, 0.0)
    assert mode.request(0, 0, 0.0) == [] and mode.empty_requests == 1


def test_division_groups_inside_a_division_and_reshuffles_after_a_round():
    mode, ledger = _mode(DivisionMode, n=6, size=3, seed=5)
    divisions = mode.divisions()
    assert sorted(w for d in divisions for w in d) == list(range(6)) and all(len(d) == 3 for d in divisions)
    (group,) = mode.request(divisions[0][0], 0, 0.0)
    assert set(group.members) == set(divisions[0])
    (second,) = mode.request(divisions[1][0], 0, 0.0)
    assert set(second.members) == set(divisions[1])
    rng = random.Random(5)  # the same generator: the first shuffle, then the one after the round of 2 groups
    for _ in range(2):
        perm = list(range(6))
        rng.shuffle(perm)
    assert mode.divisions() == [perm[:3], perm[3:]]
    assert mode.request(divisions[0][1], 0, 0.0) == [group]  # its queued group first


def test_division_never_groups_a_busy_worker():
    mode, ledger = _mode(DivisionMode, n=4, size=2)
    (group,) = mode.request(0, 0, 0.0)
    for w in group.members:
        assert ledger.is_busy(w)
    partner = next(m for m in group.members if m != 0)
    assert mode.request(partner, 0, 0.0) == [group]


def test_static_answers_step_k_of_the_schedule_and_takes_no_replacement():
    mode, ledger = _mode(StaticMode, n=4, size=2, seed=3)
    steps = static_schedule(4, 2, seed=3)
    assert mode.period == len(steps)
    for k in range(2 * len(steps)):
        (group,) = mode.request(1, k, 0.0)
        assert 1 in group.members and group.members in steps[k % len(steps)]
    assert mode.leave(1, 0.0) == [] and 1 in ledger.left
    with pytest.raises(ValueError, match="no replacements"):
        mode.rejoin(1, 1)


def test_static_refuses_nodes_that_do_not_divide_the_workers():
    with pytest.raises(OptionError, match="whole nodes"):
        StaticMode.check_settings(6, 2, 4)
    StaticMode.check_settings(8, 2, 4)


def test_smart_learns_compute_times_and_groups_workers_due_within_the_window():
    mode, ledger = _mode(SmartMode, n=3)
    for w in range(3):
        assert mode.request(w, 0, 0.0) == []  # nothing learnt yet: no partners
    assert mode.compute_estimate(0) is None
    # 1 and 0 ask at 0.1 s (computed 0.1 s each: due again at 0.2 s), 2 at 0.101 s (due at 0.202 s);
    # nobody else is due within 5% of their compute time, so nobody is grouped yet
    assert mode.request(1, 1, 0.100) == [] and mode.compute_estimate(1) == pytest.approx(0.1)
    assert mode.request(0, 1, 0.100) == []
    assert mode.request(2, 1, 0.101) == []
    # 0 asks again just after 0.2 s: 1 was due at 0.2 s, 2 is due at 0.202 s; a pair takes the soonest
    (group,) = mode.request(0, 2, 0.2 + SMART_WINDOW * 0.01)
    assert group.members == (0, 1) and mode.empty_requests == 6


def test_smart_adopts_an_estimate_only_when_it_has_none():
    mode, _ = _mode(SmartMode, n=2)
    mode.adopt_compute_estimate(0, 0.5)
    mode.adopt_compute_estimate(0, 0.9)
    assert mode.compute_estimate(0) == 0.5 and mode.compute_estimate(1) is None


def test_the_generator_delegates_to_its_strategy_and_reports_its_counters():
    gg = GroupGenerator(4, 2, "buffer", seed=1)
    assert isinstance(gg.strategy, BufferMode)
    gg.request(0, 0.0)
    totals = gg.totals()
    assert totals == {"gg_groups_formed": 1, "members": 2, "gg_requests": 1, "gg_empty_requests": 0}
    assert gg.stats()["gg_mode"] == "buffer"


def test_a_shard_generator_numbers_from_its_first_seq_and_counts_everyone_absent_until_they_arrive():
    gg = GroupGenerator(4, 2, "random", first_seq=7 << 32, absent=True)
    assert gg.left() == frozenset(range(4))
    gg.arrive(0)
    gg.arrive(2)
    (group,) = gg.request(0, 0.0)
    assert group.seq == 7 << 32 and group.members == (0, 2)
