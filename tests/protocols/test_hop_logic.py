"""Property tests of the pure Hop logic under random schedules (no processes, no clocks)."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetrain.errors import UsageError
from hetrain.protocols.hop_config import HopConfig
from hetrain.protocols.hop_logic import AverageTerm, make_hop_workers
from hetrain.protocols.lag_compensation import OwnProgress
from hetrain.topology import make_topology


def run_random_schedule(topology, config, iterations, seed, slow=None):
    """Drive every worker with random interleavings of its enabled actions.

    Returns the workers and the averages taken. Fails the test on a deadlock
    (some worker unfinished and nothing enabled) or when the token bound breaks.
    """
    rng = random.Random(seed)
    workers = make_hop_workers(topology, config)
    n = topology.num_workers
    in_flight = []  # ("update"|"token", src, dst, iteration_or_count)
    computing = [False] * n
    completed = [0] * n  # iterations completed (including skipped ones)
    averages = []
    steps = 0
    while min(w.iteration for w in workers) < iterations:
        steps += 1
        assert steps < 200_000, "schedule did not finish"
        actions = []
        for i, w in enumerate(workers):
            if w.iteration >= iterations:
                continue
            if not w.started:
                if w.plan_skip() is not None:
                    actions.append(("skip", i))
                if w.can_start():
                    actions.append(("start", i))
            elif computing[i]:
                actions.append(("compute", i))
            elif w.ready_to_average():
                actions.append(("complete", i))
        heads = {}  # channels are FIFO: only the oldest message of each (kind, src, dst) can arrive
        for index, (what, src, dst, _) in enumerate(in_flight):
            heads.setdefault((what, src, dst), index)
        actions += [("deliver", index) for index in heads.values()]
        assert actions, f"deadlock: {[w.waiting_for() for w in workers]}"
        weights = [5 if a[0] == "deliver" else (1 if slow is not None and a[1] == slow else 6) for a in actions]
        kind, who = rng.choices(actions, weights)[0]
        if kind == "deliver":
            what, src, dst, value = in_flight.pop(who)
            if what == "update":
                workers[dst].receive_update(src, value, f"model of {src} at {value}")
            else:
                workers[dst].receive_tokens(src, value)
            continue
        w = workers[who]
        if kind == "skip":
            plan = w.apply_skip(w.plan_skip())
            completed[who] = w.iteration
            in_flight += [("token", who, j, plan.token_count) for j in plan.tokens_to]
            in_flight += [("update", who, m, w.iteration - 1) for m in w.out_neighbors]
        elif kind == "start":
            w.start()
            computing[who] = True
            if config.max_ig is not None:
                for m in w.out_neighbors:  # Hop's guarantee: never more than max_ig ahead
                    assert w.iteration + 1 - completed[m] <= config.max_ig
        elif kind == "compute":
            computing[who] = False
            in_flight += [("update", who, m, w.iteration) for m in w.out_neighbors]
        else:
            plan = w.complete()
            completed[who] = w.iteration
            averages.append((who, plan))
            in_flight += [("token", who, j, plan.token_count) for j in plan.tokens_to]
    return workers, averages


topologies = st.sampled_from(["ring", "double_ring", "torus", "hypercube", "exponential", "complete"])


@settings(max_examples=60, deadline=None)
@given(topologies, st.integers(4, 8), st.integers(0, 10_000))
def test_dpsgd_averages_only_same_iteration_models(name, n, seed):
    if name == "hypercube":
        n = 8 if n > 4 else 4
    if name == "torus" and n in (5, 7):
        n = 6
    topology = make_topology(name, n)
    config = HopConfig().validated_for(topology)
    workers, averages = run_random_schedule(topology, config, iterations=6, seed=seed)
    for who, plan in averages:
        assert len(plan.terms) == len(topology.in_neighbors[who])
        assert all(t.iteration == plan.iteration for t in plan.terms)
        assert abs(plan.self_weight + sum(t.weight for t in plan.terms) - 1) < 1e-12
    assert all(w.updates_stale == 0 and w.updates_dropped == 0 for w in workers)


@settings(max_examples=150, deadline=None)
@given(topologies, st.integers(4, 8), st.integers(0, 2), st.integers(0, 2), st.integers(1, 5),
       st.integers(0, 3), st.integers(0, 10_000))
def test_hop_never_deadlocks_and_counts_updates(name, n, backup, staleness, max_ig, skip, seed):
    if name == "hypercube":
        n = 8 if n > 4 else 4
    if name == "torus" and n in (5, 7):
        n = 6
    topology = make_topology(name, n)
    backup = min(backup, min(len(x) for x in topology.in_neighbors) - 1)
    config = HopConfig(backup, staleness, max_ig, max(0, min(skip, max_ig - 2)) or None).validated_for(topology)
    workers, averages = run_random_schedule(topology, config, iterations=12, seed=seed, slow=0)
    late_terms = []
    for who, plan in averages:
        in_window = [t for t in plan.terms if t.iteration >= plan.iteration - staleness]
        assert len(in_window) >= len(topology.in_neighbors[who]) - backup
        assert abs(plan.self_weight + sum(t.weight for t in plan.terms) - 1) < 1e-12
        late_terms += [(who, t.src, t.iteration) for t in plan.terms if t not in in_window]
    assert len(late_terms) == len(set(late_terms)) == sum(w.updates_late for w in workers)  # each used once
    for w in workers:
        queued = sum(len(q) for q in w.queues.values())
        assert w.updates_received == w.updates_used + w.updates_dropped + queued
        assert w.queued_updates == queued <= w.queued_updates_max


def test_stale_and_dropped_counts_by_hand():
    topology = make_topology("ring", 3)
    config = HopConfig(backup=1, staleness=1, max_ig=4).validated_for(topology)
    w = make_hop_workers(topology, config)[0]  # in-neighbours 1 and 2
    w.start()
    w.receive_update(1, 0, "a0")
    plan = w.complete()  # iteration 0 with worker 1's update only (backup 1)
    assert [t.payload for t in plan.terms] == ["a0"]
    assert plan.self_weight == pytest.approx(0.5)
    w.start()
    w.receive_update(2, 0, "b0")  # late: usable at iteration 1 with staleness 1
    w.receive_update(1, 1, "a1")
    plan = w.complete()
    assert sorted(t.payload for t in plan.terms) == ["a1", "b0"]
    assert w.updates_stale == 1
    w.start()
    w.receive_update(2, 1, "b1")
    w.receive_update(2, 2, "b2")  # b1 is superseded by the fresher b2: dropped
    plan = w.complete()
    assert [t.payload for t in plan.terms] == ["b2"]
    assert w.updates_dropped == 1


def test_an_always_late_neighbours_newest_update_is_used_at_its_full_weight():
    """Backup workers never wait for a straggler; its updates, too late for their window, must still be
    mixed in (once each, the newest only), or its data drops out of the model (docs/decisions/hop-uses-late-updates.md)."""
    topology = make_topology("ring", 3)
    config = HopConfig(backup=1, staleness=1, max_ig=8).validated_for(topology)
    w = make_hop_workers(topology, config)[0]  # in-neighbours 1 (fast) and 2 (the straggler)
    for k in range(3):
        w.start()
        w.receive_update(1, k, f"a{k}")
        assert [t.payload for t in w.complete().terms] == [f"a{k}"]
    w.start()
    w.receive_update(2, 0, "b0")  # iteration 0 at iteration 3: outside the window 2..3, not waited for
    w.receive_update(2, 1, "b1")
    assert not w.ready_to_average()  # late updates do not count toward the n - b waited for
    w.receive_update(1, 3, "a3")
    plan = w.complete()
    assert {t.payload: t.weight for t in plan.terms} == pytest.approx({"a3": 1 / 3, "b1": 1 / 3})
    assert plan.self_weight == pytest.approx(1 / 3)
    assert (w.updates_late, w.updates_dropped) == (1, 1)  # b1 used, the older b0 dropped
    w.start()
    w.receive_update(1, 4, "a4")
    assert [t.payload for t in w.complete().terms] == ["a4"]  # b1 is not used twice

def test_an_old_update_names_the_iteration_whose_steps_it_lacks():
    """With ``late_updates="progress"`` a stale or late term carries its own iteration as ``reference``, and
    the worker's own steps since then are put back (P_k - P_k'); a term of this iteration, or a newer
    stand-in after a skip, carries none. Hop's rule, the default, marks nothing."""
    topology = make_topology("ring", 3)
    config = HopConfig(backup=1, staleness=1, max_ig=8, skip_threshold=2,
                       late_updates="progress").validated_for(topology)
    w = make_hop_workers(topology, config)[0]
    progress = OwnProgress(w.progress_iterations_kept)
    for k in range(4):
        progress.sent(k, 10.0 * k + 1 + k)  # mixed at 10 k, then k + 1 of its own steps (1, 2, 3, 4)
        w.start()
        w.receive_update(1, k, f"a{k}")
        if k == 3:
            w.receive_update(2, 0, "b0")  # late (window 2..3)
            w.receive_update(2, 2, "b2")  # stale by one
        plan = w.complete()
        progress.mixed(10.0 * (k + 1))
    assert {t.payload: t.reference for t in plan.terms} == {"a3": None, "b2": 2}
    lost = [progress.lost_steps(t) for t in plan.terms]
    assert lost[0] is None and lost[1][0] - lost[1][1] == 4.0  # P_3 - P_2: the 4 steps of iteration 3
    w.start()
    w.receive_update(1, 6, "a6")  # worker 1 skipped past the window: its newer update stands in
    w.receive_update(2, 4, "b4")
    assert {t.payload: t.reference for t in w.complete().terms} == {"a6": None, "b4": None}
    for k in range(4, 4 + w.progress_iterations_kept):
        progress.sent(k, 10.0 * k + 1)
    late = AverageTerm(2, 3, 0.5, "b3", reference=3)
    assert progress.lost_steps(late) is None  # P_3 no longer kept: mixed as it is, and counted
    assert (progress.compensated, progress.uncompensated) == (1, 1)
    hop = make_hop_workers(topology, HopConfig(backup=1, staleness=1, max_ig=8).validated_for(topology))[0]
    hop.start()
    hop.receive_update(1, 0, "a0")
    hop.complete()
    hop.start()
    hop.receive_update(2, 0, "b0")
    hop.receive_update(1, 1, "a1")
    assert [t.reference for t in hop.complete().terms] == [None, None]  # Hop's rule, the default: as models
    assert hop.progress_iterations_kept == 1


def test_skip_jumps_to_neighbours_and_returns_owed_tokens():
    topology = make_topology("ring", 3)
    config = HopConfig(backup=1, max_ig=4, skip_threshold=2).validated_for(topology)
    w = make_hop_workers(topology, config)[0]
    for k in range(3):
        w.receive_update(1, k, f"a{k}")
    assert w.plan_skip() is None  # worker 2 is not ahead: only a worker behind everyone skips
    for k in range(3):
        w.receive_update(2, k, f"b{k}")
    plan = w.plan_skip()
    assert (plan.from_iteration, plan.to_iteration) == (0, 2)
    average = w.apply_skip(plan)
    assert sorted(t.payload for t in average.terms) == ["a2", "b2"]
    assert average.token_count == 2 and sorted(average.tokens_to) == [1, 2]
    assert w.iteration == 2 and w.skipped_iterations == 2
    assert w.updates_dropped == 4  # a0, a1, b0, b1 fell out of the window (staleness 0)


def test_deadlock_prone_or_useless_settings_are_rejected():
    ring = make_topology("ring", 8)
    with pytest.raises(UsageError, match="fewer than every worker's in-neighbours"):
        HopConfig(backup=2).validated_for(ring)
    with pytest.raises(UsageError, match="at most max_ig minus 2") as info:
        HopConfig(backup=1, max_ig=3, skip_threshold=2).validated_for(ring)
    assert info.value.for_cli().startswith("--skip-threshold 2 must be at most --max-ig minus 2")
    with pytest.raises(UsageError, match="max_ig must be >= 1"):
        HopConfig(max_ig=0).validated_for(ring)
    assert HopConfig(backup=1).validated_for(ring).max_ig is not None


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 12), st.integers(0, 3),
       st.lists(st.lists(st.integers(0, 16), max_size=5), min_size=2, max_size=2))
def test_usable_count_agrees_with_looking_for_each_neighbours_usable_update(iteration, staleness, queues):
    """usable_count reads the newest update first; it must count exactly the neighbours _usable finds
    an update for, whatever the queues hold (late, old, out-of-window or newer updates)."""
    topology = make_topology("ring", 3)
    w = make_hop_workers(topology, HopConfig(backup=1, staleness=staleness, max_ig=4).validated_for(topology))[0]
    w.iteration = iteration
    for src, arrivals in zip(sorted(w.in_weights), queues):
        for k in arrivals:
            w.receive_update(src, k, None)
    assert w.usable_count() == sum(w._usable(j) is not None for j in w.in_weights)


def test_a_neighbour_replaced_between_two_looks_starts_afresh():
    """A death and its replacement adopted in one look keep the graph as it was: what the dead process
    sent must go (the replacement's updates start at the iteration it adopted, maybe lower, and a queue
    must stay in iteration order), and the edge's tokens start at max_ig, as a death and a join adopted
    apart would give."""
    from hetrain.protocols.hop_config import HopOptions
    from hetrain.protocols.hop_logic import HopWorker

    topology = make_topology("ring", 4)
    config = HopOptions().config_for(topology)
    worker = HopWorker.for_rank(topology, 0, config)  # in-neighbours 1 and 3
    worker.iteration = 12
    for k in (12, 13):
        worker.receive_update(3, k, f"old@{k}")  # the dead process was ahead
    worker.tokens[3] = 1
    worker.replace_neighbour(3)
    for k in (11, 12):
        worker.receive_update(3, k, f"new@{k}")  # the replacement adopted iteration 11
    worker.receive_update(1, 12, "one@12")
    assert [k for k, _ in worker.queues[3]] == [11, 12]
    assert worker.tokens[3] == config.max_ig
    assert worker.updates_dropped == 2 and worker.queued_updates == 3
    worker.start()
    plan = worker.complete()
    assert [(t.iteration, t.payload) for t in plan.terms if t.src == 3] == [(12, "new@12")]
