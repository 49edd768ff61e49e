"""Deaths in the pure layer: graph repair keeps the survivors connected, Hop stays deadlock-free with
workers dying at random points, the Group Generator never groups the dead, fault specs parse."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetrain.errors import UsageError
from hetrain.faults import parse_fail
from hetrain.protocols.group_generator import GroupGenerator
from hetrain.protocols.hop_config import DPSGDOptions, HopOptions
from hetrain.protocols.hop_logic import HopWorker, make_hop_workers
from hetrain.protocols.membership import neighbour_weights, repair, survivors_strongly_connected
from hetrain.topology import TOPOLOGIES, make_topology

SIZES = {"ring": 8, "double_ring": 8, "torus": 9, "hypercube": 8, "exponential": 8, "complete": 6}


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_any_single_death_leaves_the_survivors_strongly_connected(name):
    topology = make_topology(name, SIZES[name])
    for dead in range(topology.num_workers):
        repaired = repair(topology, {dead})
        assert survivors_strongly_connected(repaired, {dead}), (name, dead)
        assert not repaired.in_neighbors[dead] and not repaired.out_neighbors[dead]
        w = repaired.mixing_matrix
        alive = [i for i in range(topology.num_workers) if i != dead]
        for i in alive:
            assert w[i].sum() == pytest.approx(1.0) and w[i, dead] == 0.0
        if topology.is_symmetric:  # Metropolis weights: the survivors' average is preserved
            assert w[alive][:, alive].sum(axis=0) == pytest.approx([1.0] * len(alive))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(TOPOLOGIES), st.data())
def test_random_deaths_keep_connected_survivors_connected_in_any_order(name, data):
    topology = make_topology(name, SIZES[name])
    n = topology.num_workers
    dead = data.draw(st.sets(st.integers(0, n - 1), max_size=n - 2))
    order = data.draw(st.permutations(sorted(dead)))
    step_by_step = topology
    for d in order:  # learning of the deaths one at a time gives the same graph as all at once
        step_by_step = repair(step_by_step, set(order[: order.index(d) + 1]))
    assert step_by_step.edges == repair(topology, dead).edges
    assert survivors_strongly_connected(repair(topology, dead), dead)


def _possible_actions(workers, live, computing, inbox):
    """What may happen next: a live worker begins, computes or completes an iteration, or a message arrives."""
    actions = []
    for i in live:
        w = workers[i]
        if not w.started and (w.plan_skip() is not None or w.can_start()):
            actions.append(("begin", i))
        elif w.started and i not in computing:
            actions.append(("compute", i))
        elif w.started and w.ready_to_average():
            actions.append(("complete", i))
    return actions + [("deliver", k) for k in range(len(inbox))]


def _run_hop_with_deaths(name, seed, iterations=25):
    """Random schedules on the pure logic; deaths at random points; every survivor must finish."""
    rng = random.Random(seed)
    topology = make_topology(name, SIZES[name])
    config = HopOptions().config_for(topology)
    workers = make_hop_workers(topology, config)
    n = topology.num_workers
    deaths = {rng.randrange(n): rng.randrange(1, 4 * iterations) for _ in range(rng.randrange(1, n // 2 + 1))}
    dead, inbox, computing, steps = set(), [], set(), 0
    last_sent: dict[int, int] = {}  # worker -> iteration of the last model it sent
    while True:
        steps += 1
        for d, when in deaths.items():
            if d not in dead and steps >= when:
                dead.add(d)
                topology_now = repair(topology, dead)
                for i, w in enumerate(workers):
                    if i not in dead:
                        in_w, self_w, out = neighbour_weights(topology_now, i)
                        new_out = w.reconfigure(in_w, self_w, out)
                        if i in last_sent:  # the driver's half of a repair: new out-neighbours get the last model
                            inbox += [("update", m, i, last_sent[i]) for m in new_out]
        live = [i for i in range(n) if i not in dead and workers[i].iteration < iterations]
        if not live:
            return workers, dead
        actions = _possible_actions(workers, live, computing, inbox)
        assert actions, f"deadlock at step {steps}: dead {sorted(dead)}, " + "; ".join(
            f"{i} waits for {workers[i].waiting_for()}" for i in live)
        kind, x = rng.choice(actions)
        if kind == "deliver":
            msg = inbox.pop(x)
            dst = msg[1]
            if dst in dead:
                continue
            if msg[0] == "update" and msg[2] in workers[dst].in_weights:
                workers[dst].receive_update(msg[2], msg[3], None)
            elif msg[0] == "tokens" and msg[2] in workers[dst].tokens:
                workers[dst].receive_tokens(msg[2], msg[3])
        elif kind == "begin":
            w = workers[x]
            skip = w.plan_skip()
            if skip is not None:
                plan = w.apply_skip(skip)
                inbox += [("tokens", j, x, plan.token_count) for j in plan.tokens_to]
                inbox += [("update", m, x, w.iteration - 1) for m in w.out_neighbors]
                last_sent[x] = w.iteration - 1
            else:
                w.start()
        elif kind == "compute":
            computing.add(x)
            inbox += [("update", m, x, workers[x].iteration) for m in workers[x].out_neighbors]
            last_sent[x] = workers[x].iteration
        else:
            computing.discard(x)
            plan = workers[x].complete()
            inbox += [("tokens", j, x, 1) for j in plan.tokens_to]


@pytest.mark.parametrize("name", TOPOLOGIES)
@pytest.mark.parametrize("seed", range(12))
def test_hop_with_deaths_at_random_points_never_deadlocks(name, seed):
    workers, dead = _run_hop_with_deaths(name, seed)
    for i, w in enumerate(workers):
        if i not in dead:
            assert w.iteration >= 25
            assert not set(w.in_weights) & dead and not set(w.out_neighbors) & dead


def _run_hop_with_replacements(name, seed, protocol, iterations=30):
    """As above, and every dead worker comes back (respawn) a random number of steps later: a new
    HopWorker on the graph of that moment, taking the newest model its in-neighbours send it (each sends
    its last one to its new out-neighbours) and that model's iteration. Messages carry both ends'
    incarnations; those to or from a replaced process are dropped, as the runtime's pair groups do."""
    rng = random.Random(seed)
    topology = make_topology(name, SIZES[name])
    config = (HopOptions().config_for(topology) if protocol == "hop" else DPSGDOptions(name).config_for(topology))
    workers = make_hop_workers(topology, config)
    n = topology.num_workers
    events = []  # (step, kind, worker)
    for d in rng.sample(range(n), rng.randrange(1, n // 2 + 1)):
        dies = rng.randrange(1, 3 * iterations)
        events += [(dies, "die", d), (dies + rng.randrange(1, 60), "join", d)]
    events.sort()
    dead, inbox, computing, adopting, steps = set(), [], set(), set(), 0
    incarnation = [0] * n
    last_sent: dict[int, int] = {}

    def send(kind, dst, src, value):
        inbox.append((kind, dst, src, value, incarnation[src], incarnation[dst]))

    def reconfigure_survivors():
        now = repair(topology, dead)
        for i, w in enumerate(workers):
            if i not in dead:
                in_w, self_w, out = neighbour_weights(now, i)
                for m in w.reconfigure(in_w, self_w, out):
                    if i in last_sent:
                        send("update", m, i, last_sent[i])
        return now

    while True:
        steps += 1
        while events and events[0][0] <= steps:
            _, kind, d = events.pop(0)
            if kind == "die":
                dead.add(d)
                computing.discard(d)
                adopting.discard(d)
                last_sent.pop(d, None)
            else:
                dead.discard(d)
                incarnation[d] += 1
                workers[d] = HopWorker.for_rank(repair(topology, dead), d, config)
                adopting.add(d)
            reconfigure_survivors()
        for d in list(adopting):
            held = [q[-1][0] for q in workers[d].queues.values() if q]
            if held:
                workers[d].iteration = max(held)
                adopting.discard(d)
        live = [i for i in range(n) if i not in dead and workers[i].iteration < iterations]
        if not live and not events:
            return workers, dead
        actions = [("wait", None)] if events else []  # a pending death or join is also progress
        actions += _possible_actions(workers, [i for i in live if i not in adopting], computing, inbox)
        assert actions, f"deadlock at step {steps}: dead {sorted(dead)}, adopting {sorted(adopting)}; " + "; ".join(
            f"{i} waits for {workers[i].waiting_for()}" for i in live)
        kind, x = rng.choice(actions)
        if kind == "wait":
            steps = max(steps, events[0][0] - 1)
        elif kind == "deliver":
            what, dst, src, value, src_inc, dst_inc = inbox.pop(x)
            if dst in dead or src_inc != incarnation[src] or dst_inc != incarnation[dst]:
                continue  # to or from a process that has died or been replaced since
            if what == "update":  # the logic drops what arrives over an edge removed meanwhile
                workers[dst].receive_update(src, value, None)
            else:
                workers[dst].receive_tokens(src, value)
        elif kind == "begin":
            w = workers[x]
            skip = w.plan_skip()
            if skip is not None:
                plan = w.apply_skip(skip)
                for j in plan.tokens_to:
                    send("tokens", j, x, plan.token_count)
                for m in w.out_neighbors:
                    send("update", m, x, w.iteration - 1)
                last_sent[x] = w.iteration - 1
            else:
                w.start()
        elif kind == "compute":
            computing.add(x)
            for m in workers[x].out_neighbors:
                send("update", m, x, workers[x].iteration)
            last_sent[x] = workers[x].iteration
        else:
            computing.discard(x)
            plan = workers[x].complete()
            for j in plan.tokens_to:
                send("tokens", j, x, 1)


@pytest.mark.parametrize("protocol", ["hop", "dpsgd"])
@pytest.mark.parametrize("name", TOPOLOGIES)
@pytest.mark.parametrize("seed", range(8))
def test_hop_with_replacements_joining_at_random_points_never_deadlocks(protocol, name, seed):
    workers, dead = _run_hop_with_replacements(name, seed, protocol)
    assert not dead  # every dead worker came back
    for w in workers:
        assert w.iteration >= 30


@pytest.mark.parametrize("mode", ["random", "buffer", "division", "smart"])
def test_the_group_generator_never_groups_a_dead_worker(mode):
    """Groups formed before a death may still be handed out (their other members skip them);
    no group formed after it includes the dead."""
    gg = GroupGenerator(8, 3, mode, seed=1)
    rng = random.Random(2)
    now, formed_after = 0.0, {}
    for step in range(400):
        for dead, when in ((5, 100), (2, 200)):
            if step == when:
                gg.leave(dead, now)  # the launcher tells the GG that the worker died
                formed_after[dead] = gg.ledger.next_seq
        worker = rng.choice([w for w in range(8) if w not in gg.left()])
        now += rng.random() * 0.01
        for group in gg.request(worker, now):
            for dead, first_seq in formed_after.items():
                assert group.seq < first_seq or dead not in group.members
    assert sum(1 for _ in formed_after) == 2 and gg.ledger.next_seq > max(formed_after.values())


def test_fail_specs_parse_and_refuse_nonsense():
    assert parse_fail("none").kills(8, 100) == []
    assert parse_fail("3@20s,5@40").kills(8, 100) == [(20.0, 3), (40.0, 5)]
    assert parse_fail("3@20s,5@40").kills(8, 30) == [(20.0, 3)]
    kills = parse_fail("random:rate=6", seed=4).kills(8, 60)
    assert kills == parse_fail("random:rate=6", seed=4).kills(8, 60) and 1 <= len(kills) <= 7
    assert len({w for _, w in kills}) == len(kills)  # each worker dies once, one stays alive
    for bad in ("3@", "x@20s", "random:rate=0", "random:p=1", "3@20s,oops"):
        with pytest.raises(UsageError, match="--fail"):
            parse_fail(bad)
    with pytest.raises(UsageError, match="names worker 9"):
        parse_fail("9@5s").check_workers(4)
    with pytest.raises(UsageError, match="twice"):
        parse_fail("1@5s,1@9s").check_workers(4)
