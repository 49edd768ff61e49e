"""Pure tests of the Group Generator, the static schedule and AD-PSGD's pairing (no processes)."""

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetrain.errors import UsageError
from hetrain.protocols.adpsgd_pairing import ActivePassivePairing
from hetrain.protocols.comm_lru import CommunicatorLRU
from hetrain.protocols.group_generator import GG_MODES, GroupGenerator, static_schedule, validate_gg
from hetrain.protocols.sharded_gg import ShardedGroupGenerator


def _play(scheduler, num_workers, iterations, draw, check=None):
    """Interleave requests, leaves and group executions in the order ``draw`` picks.

    A worker with nothing to run either requests (while it has iterations left)
    or leaves; a group runs when it is at the head of every member's to-do list.
    Returns the groups each worker ran. Fails if work remains but nothing can move
    (a deadlock), if a worker's groups leave the global order, or if a requester
    is missing from the groups its own request created.
    """
    todo = {w: deque() for w in range(num_workers)}
    done = [0] * num_workers
    left: set[int] = set()
    ran: dict[int, list] = {w: [] for w in range(num_workers)}
    now = 0.0
    while True:
        events = []
        for w in range(num_workers):
            if w not in left and not todo[w]:
                events.append(("request", w) if done[w] < iterations[w] else ("leave", w))
        heads = {}
        for w, queue in todo.items():
            if queue:
                heads.setdefault(queue[0].seq, []).append(w)
        for w, queue in todo.items():
            if queue and sorted(heads[queue[0].seq]) == list(queue[0].members) and w == queue[0].members[0]:
                events.append(("run", queue[0]))
        if not events:
            stuck = {w: [g.members for g in q] for w, q in todo.items() if q}
            assert not stuck, f"deadlock: {stuck}"
            assert left == set(range(num_workers))
            return ran
        kind, what = events[draw(len(events))]
        now += 0.001 * (1 + draw(10))
        if kind == "request":
            done[what] += 1
            ledger = getattr(scheduler, "ledger", None)  # the sharded generator has one per shard
            before = ledger.next_seq if ledger else None
            groups = scheduler.request(what, now)
            assert all(what in g.members for g in groups)
            if ledger and scheduler.mode != "static":  # a group created by this request includes the requester
                assert all(what in g.members for g in ledger.open_groups() if g.seq >= before)
            todo[what].extend(groups)
        elif kind == "leave":
            left.add(what)
            todo[what].extend(scheduler.leave(what, now))
        else:
            for m in what.members:
                assert todo[m].popleft() == what
                assert not ran[m] or ran[m][-1].seq < what.seq, "groups must run in the global order"
                ran[m].append(what)
        if check is not None:
            check(scheduler)


def _open_groups_disjoint(scheduler):
    seen: set[int] = set()
    for group in scheduler.ledger.open_groups():
        assert not seen & set(group.members), f"overlapping open groups: {scheduler.ledger.open_groups()}"
        seen |= set(group.members)


@pytest.mark.parametrize("mode", GG_MODES)
@settings(max_examples=40, deadline=None)
@given(data=st.data(), n=st.integers(2, 7), size=st.integers(1, 4), seed=st.integers(0, 99))
def test_random_interleavings_never_deadlock(mode, data, n, size, seed):
    size = min(size, n)
    gg = GroupGenerator(n, size, mode, seed=seed, cache_size=3)
    iterations = data.draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
    if mode == "static":  # static workers leave together (the protocol agrees on the step)
        iterations = [max(iterations)] * n
    check = _open_groups_disjoint if mode == "division" else None
    ran = _play(gg, n, iterations, lambda k: data.draw(st.integers(0, k - 1)), check)
    for groups in ran.values():
        assert all(len(g.members) <= max(size, 1) or mode == "static" for g in groups)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(1, 8), seed=st.integers(0, 99))
def test_adpsgd_pairing_never_deadlocks(data, n, seed):
    pairing = ActivePassivePairing(n, seed=seed, cache_size=2)
    iterations = data.draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
    ran = _play(pairing, n, iterations, lambda k: data.draw(st.integers(0, k - 1)))
    for groups in ran.values():
        for g in groups:
            assert len(g.members) == 2
            assert pairing.is_active(g.members[0]) != pairing.is_active(g.members[1])


def test_adpsgd_pairs_only_with_passives_still_training_and_every_pair_is_owed_to_both():
    """Passives never wait, so one may leave before any active asks: it is never paired, nobody waits for it."""
    pairing = ActivePassivePairing(4, seed=0)
    for _ in range(60):  # passive 1 runs all its iterations before any active asks
        assert pairing.request(1) == []
    assert pairing.leave(1) == []
    for _ in range(5):
        for active in (0, 2):
            (pair,) = pairing.request(active)
            assert pair.members == (active, 3)  # the only passive still training
    owed = pairing.request(3)  # passive 3 serves, in order, every pair queued for it
    assert [g.members for g in owed] == [(0, 3), (2, 3)] * 5
    assert [g.seq for g in owed] == sorted(g.seq for g in owed)
    (pair,) = pairing.request(0)
    assert pairing.leave(3) == [pair]  # a pair queued for a leaving passive is still run by it
    assert pairing.request(2) == []  # no passive left: an empty sync, no wait
    assert pairing.ledger.open_groups() == []
    assert pairing.stats()["gg_groups_formed"] == 11


@pytest.mark.parametrize("mode", ["random", "buffer", "division", "smart"])
def test_every_new_group_contains_its_requester(mode):
    gg = GroupGenerator(6, 3, mode, seed=1)
    for step in range(60):
        worker = (step * 5) % 6
        before = gg.ledger.next_seq
        groups = gg.request(worker, now_s=step * 0.01)
        created = [g for g in groups if g.seq >= before]
        assert all(worker in g.members for g in groups)  # its own and those others queued for it
        assert len(created) <= 1
        for g in groups:  # the caller runs them; mark the others as started so groups close
            for m in g.members:
                if m != worker:
                    gg.ledger.pop(m)


def test_static_groups_contain_the_worker_and_steps_are_partitions():
    for n, size, per_node in [(8, 3, None), (8, 2, 4), (12, 3, 4), (6, 4, None), (4, 2, 1)]:
        steps = static_schedule(n, size, per_node, seed=3)
        for groups in steps:
            members = [m for g in groups for m in g]
            assert len(members) == len(set(members)), f"overlap in a static step: {groups}"
        gg = GroupGenerator(n, size, "static", seed=3, workers_per_node=per_node)
        for k in range(2 * len(steps)):
            for w in range(n):
                for g in gg.request(w):
                    assert w in g.members and g.members in steps[k % len(steps)]


def test_static_schedule_matches_the_prototype_for_four_workers_per_node():
    steps = static_schedule(8, 4, workers_per_node=4)
    assert steps[0] == sorted([(0, 4), (2, 3), (6, 7)])  # local rank 0 across nodes; pairs of 2 and 3
    assert steps[1] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert steps[2] == sorted([(1, 5), (0, 3), (4, 7)])  # local rank 1 across nodes; pairs of 0 and 3
    assert steps[3] == steps[1]


def test_division_concurrent_groups_never_overlap_with_stragglers():
    gg = GroupGenerator(9, 3, "division", seed=0)
    for step in range(200):
        worker = step % 9 if step % 4 else 0  # worker 0 asks more often than the rest
        gg.request(worker, now_s=step * 0.01)
        _open_groups_disjoint(gg)


def test_smart_keeps_fast_workers_away_from_a_mid_iteration_straggler():
    gg = GroupGenerator(4, 2, "smart", seed=0)
    now, partners_of_fast = 0.0, []
    for round_ in range(40):  # workers 1-3 ask every 10 ms; worker 0 every 100 ms
        now = round_ * 0.01
        for w in (1, 2, 3) + ((0,) if round_ % 10 == 0 else ()):
            for g in gg.request(w, now):
                if w != 0 and round_ > 20:
                    partners_of_fast.extend(m for m in g.members if m != w)
                for m in g.members:
                    gg.ledger.pop(m)
    assert partners_of_fast and partners_of_fast.count(0) / len(partners_of_fast) < 0.2


def test_same_seed_same_groups():
    def run(seed):
        gg = GroupGenerator(5, 3, "buffer", seed=seed)
        return [[g.as_list() for g in gg.request(i % 5, i * 0.1)] for i in range(30)]

    assert run(7) == run(7)
    assert run(7) != run(8)


@pytest.mark.parametrize(
    "args, message, flag",
    [
        ((4, 0, "random"), "group_size", "--group-size"),
        ((4, 5, "random"), "group_size", "--group-size"),
        ((4, 2, "fancy"), "unknown gg mode", "unknown --gg mode"),
        ((6, 2, "static", 60, 4), "multiple of workers_per_node", "multiple of --workers-per-node"),
        ((4, 2, "random", 0), "communicator_cache", "--communicator-cache"),
    ],
)
def test_bad_input_is_a_one_line_error_naming_the_python_argument_or_the_flag(args, message, flag):
    with pytest.raises(UsageError, match=message) as info:
        validate_gg(*args)
    assert "\n" not in str(info.value) and "--" not in str(info.value)
    assert flag in info.value.for_cli()
    with pytest.raises(UsageError):
        GroupGenerator(args[0], args[1], args[2], cache_size=args[3] if len(args) > 3 else 60,
                       workers_per_node=args[4] if len(args) > 4 else None)


def test_lru_evicts_least_recently_used_and_replaces_stale_ids():
    lru = CommunicatorLRU(2)
    assert lru.use((0, 1), 0) == (False, [])
    assert lru.use((0, 2), 1) == (False, [])
    assert lru.use((0, 1), 0) == (True, [])
    assert lru.use((0, 3), 2) == (False, [((0, 2), 1)])
    assert lru.use((0, 1), 5) == (False, [((0, 1), 0)])
    assert (0, 1) in lru and (0, 2) not in lru and len(lru) == 2


def test_members_agree_on_communicator_ids_when_caches_evict():
    """Replaying each worker's own group sequence through its own LRU gives the GG's ids."""
    gg = GroupGenerator(5, 2, "random", seed=4, cache_size=2)
    seen: dict[int, list] = {w: [] for w in range(5)}
    for i in range(200):
        for g in gg.request(i % 5):
            for m in g.members:
                seen[m].append(g)
    for groups in seen.values():
        lru = CommunicatorLRU(2)
        for g in sorted(set(groups), key=lambda g: g.seq):
            hit, _ = lru.use(g.members, g.comm_id)
            assert hit == (g.comm_id != g.seq)


def _ledger_consistent(scheduler):
    """The ledger's incrementally kept sets equal what a scan of its open groups gives."""
    ledger = scheduler.ledger
    assert ledger.busy() == {m for g in ledger.open_groups() for m in g.members}
    assert ledger.available() == [w for w in range(ledger.num_workers) if w not in ledger.left]
    for w in range(ledger.num_workers):
        assert list(ledger.available_except(w)) == [v for v in ledger.available() if v != w]


@pytest.mark.parametrize("mode", GG_MODES)
@settings(max_examples=25, deadline=None)
@given(data=st.data(), n=st.integers(2, 7), seed=st.integers(0, 99))
def test_incremental_busy_and_available_match_a_full_scan(mode, data, n, seed):
    gg = GroupGenerator(n, min(3, n), mode, seed=seed, cache_size=3)
    iterations = data.draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
    if mode == "static":
        iterations = [max(iterations)] * n
    _play(gg, n, iterations, lambda k: data.draw(st.integers(0, k - 1)), _ledger_consistent)


def test_sampling_the_view_draws_what_sampling_the_list_draws():
    import random

    from hetrain.protocols.ledger import GroupLedger

    for n in (5, 40, 300):
        ledger = GroupLedger(n)
        for w in range(0, n, 7):
            ledger.mark_left(w)
        for worker in (1, n // 2, n - 1):
            built = [w for w in ledger.available() if w != worker]
            a, b = random.Random(n), random.Random(n)
            assert a.sample(ledger.available_except(worker), 2) == b.sample(built, 2)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), n=st.integers(2, 9), seed=st.integers(0, 99))
def test_adpsgd_kept_passive_list_draws_the_pairs_a_full_scan_draws(data, n, seed):
    """The pairing keeps its passives in a list updated on leave/rejoin; a reference that scans
    every worker per request (what it did before) must pick the same partners, seed for seed."""
    import random

    pairing = ActivePassivePairing(n, seed=seed)
    reference_rng, left = random.Random(seed), set()
    for _ in range(data.draw(st.integers(1, 40))):
        worker = data.draw(st.integers(0, n - 1))
        action = data.draw(st.sampled_from(["request", "request", "leave", "rejoin"]))
        if action == "leave" and worker not in left:
            pairing.leave(worker)
            left.add(worker)
        elif action == "rejoin" and worker in left:
            pairing.rejoin(worker, 1)
            left.discard(worker)
        elif action == "request" and worker not in left:
            formed = pairing.ledger.groups_formed
            pairing.request(worker)
            if worker % 2 == 0:
                passive = [w for w in range(n) if w % 2 == 1 and w not in left]
                expected = reference_rng.choice(passive) if passive else None
                assert (pairing.ledger.groups_formed > formed) == (expected is not None)
                if expected is not None:
                    newest = pairing.ledger.next_seq - 1
                    members = next(g for g in pairing.ledger.queues[expected] if g.seq == newest).members
                    assert members == tuple(sorted((worker, expected)))


def _timed_run(gg, compute_s, until_s):
    """Drive ``gg`` in time like the simulator: compute, request, run the returned groups in order.

    A group starts when its last member reaches it; every member continues from
    then. Returns each worker's total time waiting for partners and the partners
    of each group it ran.
    """
    import heapq

    n = len(compute_s)
    events = [(compute_s[w], w) for w in range(n)]  # (time of the next request, worker)
    heapq.heapify(events)
    arrivals: dict[int, list] = {}  # group seq -> [(member, arrival time)]
    pending = {w: deque() for w in range(n)}
    wait = [0.0] * n
    partners = {w: [] for w in range(n)}

    def next_group(w, now):
        if not pending[w]:
            heapq.heappush(events, (now + compute_s[w], w))
            return
        group = pending[w].popleft()
        arrivals.setdefault(group.seq, []).append((w, now))
        if len(arrivals[group.seq]) == len(group.members):
            here = arrivals.pop(group.seq)
            start = max(t for _, t in here)
            for m, t in here:
                wait[m] += start - t
                partners[m].append([p for p in group.members if p != m])
                next_group(m, start)

    while events and events[0][0] < until_s:
        now, w = heapq.heappop(events)
        pending[w].extend(gg.request(w, now))
        next_group(w, now)
    return wait, partners


def test_smart_fast_workers_barely_wait_and_the_straggler_still_averages():
    """8 workers, worker 0 five times slower: fast workers wait under 5% of their time for partners,
    the straggler keeps being averaged with fast workers, and everyone meets everyone's models."""
    gg = GroupGenerator(8, 3, "smart", seed=1)
    compute = [0.25] + [0.05 + 0.0005 * w for w in range(1, 8)]  # slightly unequal fast workers
    wait, partners = _timed_run(gg, compute, until_s=20.0)
    assert max(wait[1:]) < 0.05 * 20.0
    assert len(partners[0]) > 0.5 * 20.0 / 0.25  # the straggler is in a group most of its iterations
    mixing = {w: {p for group in partners[w] for p in group} for w in range(8)}
    assert all(len(mixing[w]) >= 3 for w in range(8))


def test_smart_partners_are_due_within_the_window_and_late_workers_are_passed_over():
    def warmed_up():
        gg = GroupGenerator(3, 3, "smart", seed=0)
        for w in range(3):  # first requests: nothing measured yet, so no groups
            assert gg.request(w, 0.0) == []
        gg.request(0, 0.1), gg.request(1, 0.1), gg.request(2, 0.13)  # due again at 0.2, 0.2 and 0.26
        return gg

    gg = warmed_up()  # window: SMART_WINDOW (5%) of worker 0's 0.1 s; worker 2 is due 60 ms later
    assert [g.members for g in gg.request(0, 0.2)] == [(0, 1)]
    gg = warmed_up()  # at 0.5 workers 1 and 2 are 0.3 s late: slower than measured, passed over
    assert gg.request(0, 0.5) == []


def test_smart_prefers_a_partner_it_did_not_just_average_with():
    gg = GroupGenerator(4, 2, "smart", seed=0)
    for w in range(4):  # first requests: nothing measured yet, so no groups
        assert gg.request(w, 0.0) == []
    for w in range(4):  # every worker due again at 0.2
        assert gg.request(w, 0.1) == []
    assert [g.members for g in gg.request(0, 0.2)] == [(0, 1)]  # 1 is due soonest (lowest rank on a tie)
    for w in (0, 1):
        gg.ledger.pop(w)
    assert [g.members for g in gg.request(2, 0.2)] == [(2, 3)]
    assert [g.members for g in gg.request(3, 0.201)] == [(2, 3)]  # 2 and 3 compute again from 0.201:
    # due at 0.301, inside worker 0's 5 ms window at 0.3
    # 1 is due soonest (0.3), but 0 just averaged with it: it takes 2 instead
    assert [g.members for g in gg.request(0, 0.3)] == [(0, 2)]


SHARDED_MODES = [m for m in GG_MODES if m != "static"]


@pytest.mark.parametrize("mode", SHARDED_MODES)
@settings(max_examples=40, deadline=None)
@given(data=st.data(), n=st.integers(4, 9), shards=st.integers(1, 3), epoch_ms=st.integers(2, 40),
       seed=st.integers(0, 99))
def test_sharded_generators_never_deadlock_across_epochs(mode, data, n, shards, epoch_ms, seed):
    """Workers move between shards as epochs pass (5-50 ms per event here), leave mid-way, straggle."""
    shards = min(shards, n // 2)
    gg = ShardedGroupGenerator(n, 2, mode, shards=shards, epoch_s=epoch_ms / 1000, seed=seed, cache_size=2)
    iterations = data.draw(st.lists(st.integers(0, 8), min_size=n, max_size=n))
    ran = _play(gg, n, iterations, lambda k: data.draw(st.integers(0, k - 1)))
    for worker, groups in ran.items():
        assert all(worker in g.members and len(g.members) == 2 for g in groups)
    _assert_comm_ids_agree(ran, cache_size=2)


def _assert_comm_ids_agree(ran, cache_size):
    """Each worker's own LRU, fed its groups in the order it ran them, hits exactly when the id is reused."""
    for groups in ran.values():
        lru = CommunicatorLRU(cache_size)
        for g in groups:
            hit, _ = lru.use(g.members, g.comm_id)
            assert hit == (g.comm_id != g.seq), (g, groups)


def test_sharded_split_is_a_partition_redrawn_each_epoch_and_the_same_everywhere():
    a = ShardedGroupGenerator(12, 2, "smart", shards=3, epoch_s=1.0, seed=5)
    b = ShardedGroupGenerator(12, 2, "smart", shards=3, epoch_s=1.0, seed=5)
    for epoch in range(4):
        parts = a.split(epoch)
        assert sorted(w for part in parts for w in part) == list(range(12))
        assert [len(p) for p in parts] == [4, 4, 4]
        assert parts == b.split(epoch)
        assert all(a.shard_of(w, epoch) == i for i, part in enumerate(parts) for w in part)
    assert a.split(0) != a.split(1)


def test_sharded_groups_stay_within_a_shard_of_their_epoch():
    gg = ShardedGroupGenerator(16, 2, "random", shards=4, epoch_s=0.1, seed=2)
    now = 0.0
    for step in range(400):
        worker, now = step % 16, now + 0.001
        for g in gg.request(worker, now):
            epoch = (g.seq >> 32) // 4
            assert len({gg.shard_of(m, epoch) for m in g.members}) == 1


@pytest.mark.parametrize("args, message", [
    (dict(shards=0, epoch_s=1.0), "gg_shards must be >= 1"),
    (dict(shards=5, epoch_s=1.0), "leave each shard at least 2 workers"),
    (dict(shards=2, epoch_s=0.0), "gg_epoch_s must be > 0"),
])
def test_sharded_bad_input_is_a_one_line_error(args, message):
    with pytest.raises(UsageError, match=message):
        ShardedGroupGenerator(8, 2, "smart", **args)


# ----- replacements (respawn) ----------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["smart", "random", "buffer", "division"])
def test_a_replacement_is_grouped_again_fresh_with_new_communicators(mode):
    gg = GroupGenerator(4, 2, mode, seed=3)
    for _ in range(40):  # every pair gets a cached communicator
        for w in range(4):
            gg.request(w, 0.0)
    gg.leave(2)  # died: groups formed before may still be handed out (their members skip them)
    died_at = gg.ledger.next_seq
    for t in range(20):
        for w in (0, 1, 3):
            assert all(2 not in g.members for g in gg.request(w, t * 0.1) if g.seq >= died_at)
    gg.rejoin(2, incarnation=1)
    groups = []
    for t in range(40):
        for w in (0, 1, 2, 3):
            groups += gg.request(w, 2 + t * 0.1)
    with_two = [g for g in groups if 2 in g.members]
    assert with_two, "the replacement was never grouped again"
    first = with_two[0]
    assert first.fresh == (2,) and first.incarnation_of(2) == 1
    assert first.comm_id == first.seq  # a fresh communicator: the old process's ones are gone
    gg.settle(2)
    settled_at = gg.ledger.next_seq
    later = [g for t in range(20) for w in (0, 1, 2, 3) for g in gg.request(w, 10 + t * 0.1)
             if 2 in g.members and g.seq >= settled_at]
    assert later and all(g.fresh == () and g.incarnation_of(2) == 1 for g in later)


def test_a_group_of_only_fresh_members_counts_everyone():
    pairing = ActivePassivePairing(4, seed=1)
    for w in range(4):
        pairing.leave(w)
    pairing.rejoin(0, 1)
    pairing.rejoin(1, 1)
    group = pairing.request(0)[0]
    assert group.members == (0, 1) and group.fresh == ()  # nobody holds a model to hand over: plain average


def test_groups_carry_fresh_members_and_incarnations_over_the_wire():
    from hetrain.protocols.ledger import Group

    group = Group(7, (1, 4), 7, fresh=(4,), incarnations=(0, 2))
    assert Group.from_list(group.as_list()) == group
    plain = Group(8, (0, 1), 3)
    assert plain.as_list() == [8, [0, 1], 3] and Group.from_list(plain.as_list()) == plain


@pytest.mark.parametrize("mode", ["buffer", "random"])
def test_a_second_leave_of_one_worker_changes_nothing(mode):
    """A worker leaves in finish() and then dies: the launcher's on_death leaves it again. The sharded
    generator counted it twice, swept a shard with a member still in it, and that member's next request
    raised KeyError (a healthy worker failed)."""
    for gg in (GroupGenerator(8, 2, mode, seed=0), ShardedGroupGenerator(8, 2, mode, shards=2, epoch_s=1.0, seed=0)):
        for worker in range(8):
            gg.request(worker, 0.01)
        shard = next(members for members in (gg.split(0) if hasattr(gg, "split") else [range(8)]) if 0 in members)
        gg.leave(0, 0.5)
        assert gg.leave(0, 0.6) == []
        others = [w for w in shard if w != 0]
        for worker in others[:-1]:
            gg.leave(worker, 0.7)
        for worker in (w for w in range(8) if w not in shard):
            gg.request(worker, 1.01)  # the next epoch: shards with nobody left in them are swept
        gg.request(others[-1], 1.02)  # still in its shard: must be served
