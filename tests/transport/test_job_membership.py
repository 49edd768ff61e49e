"""Who is in the job: one type (hetrain.transport.membership) for the launcher's record, the Lightning
watcher and a user's callable, and one bound for confirming a death."""

import threading
import time
import types

from hetrain.integrations.liveness import StoreLiveness
from hetrain.jobs.context import LauncherMembership
from hetrain.transport.membership import CONFIRM_DEATH_S, CallableMembership, Membership


def test_every_source_of_deaths_is_a_membership():
    assert isinstance(Membership.of(None), Membership) and Membership.of(None).dead() == set()
    users = Membership.of(lambda: {2})
    assert isinstance(users, CallableMembership) and users() == {2} and not users.replaces
    launcher = LauncherMembership([0, 1, 0], [0, 3, 0], rank=0, incarnation=0, report=lambda _: None,
                                  wait_frozen=lambda _: True)
    assert Membership.of(launcher) is launcher and launcher.dead() == {1} and launcher.replaces
    assert launcher.incarnations() == [0, 3, 0]
    assert issubclass(StoreLiveness, Membership)


def test_confirm_dead_returns_a_death_named_within_the_bound_and_nothing_otherwise():
    dead: set[int] = set()
    membership = Membership.of(lambda: set(dead))
    threading.Timer(0.2, lambda: dead.add(3)).start()
    began = time.monotonic()
    assert membership.confirm_dead(among={3}) == {3}
    assert time.monotonic() - began < CONFIRM_DEATH_S  # returned when named, not at the bound
    assert membership.confirm_dead(among={1}, within_s=0.2) == set()  # 3 died, not 1
    assert membership.confirm_dead(known={3}, within_s=0.2) == set()  # nothing new


def test_a_lost_peer_is_a_suspect_until_named_dead_and_an_error_if_never_named(monkeypatch):
    import hetrain.transport.membership as membership
    from hetrain.transport.membership import LostPeers

    now = [100.0]  # a fake clock: the verdicts do not hang on the test's own scheduling
    monkeypatch.setattr(membership, "time", types.SimpleNamespace(monotonic=lambda: now[0], sleep=time.sleep))
    lost = LostPeers(within_s=0.2)
    lost.lost(1, "lost worker 1")
    lost.lost(2, "lost worker 2")
    lost.lost(1, "a later report")  # the first report counts
    assert lost.settle(set()) == [] and lost.suspects() == {1, 2}  # within the bound: no verdict yet
    assert lost.settle({2}) == [] and lost.suspects() == {1}  # named dead: routed around, forgotten
    now[0] += 0.25
    assert lost.settle(set()) == ["lost worker 1"] and lost.suspects() == set()  # alive yet lost: an error, once
    assert lost.settle(set()) == []
