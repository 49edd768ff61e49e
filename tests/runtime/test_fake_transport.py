"""Each protocol shell's wiring on the fake transport (hetrain.testing.fake_channels): what a worker sends,
to whom, of which iteration, and how a death and compression change it, read off the fabric's record in
milliseconds. Ranks are threads of the test process; collectives run on their gloo groups over loopback.

Each test asserts on the record before it lets a failed job's error through, so a wiring mutant fails it
on the wiring (tests/mutants/test_mutants.py), not on the hang the wrong wiring leads to.
"""

import time
from collections import defaultdict

import pytest
import torch

import hetrain
from hetrain.protocols.membership import repair
from hetrain.testing.fake_channels import Fabric
from hetrain.testing.thread_ranks import SharedMembership, run_threads
from hetrain.topology import make_topology
from hetrain.transport.peer_channels import DELTA, KEYFRAME, STOP, TOKEN, UPDATE

pytestmark = pytest.mark.usefixtures("loopback")  # the collectives: gloo groups over loopback
RING = make_topology("ring", 4)


def _model(rank: int) -> torch.nn.Module:
    model = torch.nn.Linear(6, 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(torch.randn(1, 6, generator=torch.Generator().manual_seed(rank), dtype=torch.float64)
                           + 2.0 * rank)  # every worker its own start: only mixing brings them together
    return model


def _run(fn, fabric: Fabric, args: tuple = (), **kwargs):
    """run_threads, returning (results, the error it raised or None): the record is read either way."""
    try:
        return run_threads(fn, 4, args, fabric=fabric, timeout_s=15, **kwargs), None
    except (RuntimeError, TimeoutError) as exc:
        return None, exc


def _hop(rank, steps: int, settings: dict):
    model = _model(rank.rank)
    sync = hetrain.Hop(model, None, topology="ring", transport=rank.transport("hop"), timeout_s=10, **settings)
    for _ in range(steps):
        sync.step()  # no gradient: the model moves only by what the channels bring
    before = model.weight.detach().clone()
    sync.finish()
    return before, model.weight.detach().clone()


def test_hop_sends_each_iteration_s_model_to_every_out_neighbour_and_a_token_back_to_every_in_neighbour():
    fabric = Fabric()
    results, error = _run(_hop, fabric, (12, {"max_ig": 2}))
    for rank in range(4):
        by_iteration = defaultdict(list)
        for message in fabric.sent(src=rank, channel="update", kind=UPDATE):
            by_iteration[message.iteration].append(message.dst)
        assert sorted(by_iteration) == list(range(12)), f"worker {rank} sent iterations {sorted(by_iteration)}"
        for iteration, dsts in by_iteration.items():  # one model per out-neighbour per iteration, no more
            assert sorted(dsts) == RING.out_neighbors[rank], (rank, iteration, dsts)
        assert all(m.payload is not None and m.count == 1 for m in fabric.sent(src=rank, kind=UPDATE))  # one step each
        tokens = {m.dst for m in fabric.sent(src=rank, channel="token", kind=TOKEN)}
        assert tokens == set(RING.in_neighbors[rank])  # tokens flow against the updates (max_ig)
        stops = {m.dst for m in fabric.sent(src=rank, channel="update", kind=STOP)}
        assert stops == set(RING.out_neighbors[rank])  # finish: a STOP to each out-neighbour
    assert error is None, error
    before = torch.stack([b for b, _ in results])
    after = torch.stack([a for _, a in results])
    starts = torch.stack([_model(r).weight.detach() for r in range(4)])
    assert float((before - before.mean(0)).norm()) < 0.1 * float((starts - starts.mean(0)).norm())  # they mixed
    assert float((after - after.mean(0)).norm()) < 1e-9


RING_MAX_IG = 2


def _hop_one_dies(rank, members: SharedMembership, fabric: Fabric):
    model = _model(rank.rank)
    sync = hetrain.Hop(model, None, topology="ring", transport=rank.transport("hop"), on_failure="continue",
                       max_ig=RING_MAX_IG, timeout_s=10)  # max_ig 2: no skipping (threshold max_ig - 2)
    for step in range(30):
        if rank.rank == 3 and step == 8:  # it leaves without a word; the membership says so
            fabric.kill(3)
            members.kill(3)
            sync.close()
            return None
        time.sleep(0.002)
        sync.step()
    sync.finish()
    return model.weight.detach().clone()


def test_a_death_on_the_ring_is_repaired_and_the_survivors_send_over_the_new_edges_only():
    fabric, members = Fabric(), SharedMembership()
    results, error = _run(_hop_one_dies, fabric, (members, fabric), membership=members)
    repaired = repair(RING, {3})
    last_from_3 = max(m.iteration for m in fabric.sent(src=3, kind=UPDATE))
    assert last_from_3 == 7  # its 8 steps, none skipped
    # backup 1: a neighbour never waits for worker 3's models, only for its tokens (max_ig at the start, one
    # back per iteration worker 3 ended): it can start at most max_ig iterations past worker 3's last, and
    # only the repair lets it go further, sending around worker 3
    last_to_3 = max(m.iteration for m in fabric.sent(dst=3, kind=UPDATE))
    assert last_to_3 <= last_from_3 + RING_MAX_IG, (last_to_3, last_from_3)
    for rank in range(3):
        late = {m.dst for m in fabric.sent(src=rank, kind=UPDATE) if m.iteration > last_from_3 + RING_MAX_IG}
        assert late == set(repaired.out_neighbors[rank]), (rank, late, repaired.out_neighbors[rank])
    assert fabric.sent(src=2, dst=0, kind=UPDATE) and fabric.sent(src=0, dst=2, kind=UPDATE)  # the repair's edge
    assert error is None, error
    survivors = torch.stack(results[:3])
    assert results[3] is None and float((survivors - survivors.mean(0)).norm()) < 1e-9


def test_compressed_hop_sends_a_keyframe_first_then_deltas_a_fraction_of_its_size():
    fabric = Fabric()
    results, error = _run(_hop, fabric, (15, {"compression": "int8"}))
    for rank in range(4):
        for dst in RING.out_neighbors[rank]:
            kinds = [m.kind for m in fabric.sent(src=rank, dst=dst, channel="update") if m.kind != STOP]
            assert kinds[0] == KEYFRAME, (rank, dst, kinds[:3])  # the receiver holds no copy yet (other starts)
            # then mostly the difference from the copy it holds (a keyframe again only where a delta passed
            # the receiver by: how many, and when a neighbour's STOP ends the edge, vary with the threads' timing)
            assert kinds.count(DELTA) >= len(kinds) / 2 and kinds.count(DELTA) >= 3, (rank, dst, kinds)
    keyframe = fabric.sent(src=0, kind=KEYFRAME)[0]
    delta = fabric.sent(src=0, kind=DELTA)[0]
    assert delta.nbytes < keyframe.nbytes
    assert error is None, error
    after = torch.stack([a for _, a in results])
    assert float((after - after.mean(0)).norm()) < 1e-9


def _ps(rank, steps: int):
    model = _model(rank.rank)
    sync = hetrain.ParameterServer(model, None, staleness=0, transport=rank.transport("ps"), timeout_s=10)
    for _ in range(steps):
        sync.step()
    sync.finish()
    return model.weight.detach().clone()


def test_the_parameter_server_answers_each_push_to_the_worker_that_pushed_and_no_other():
    fabric = Fabric()
    results, error = _run(_ps, fabric, (8,))
    for worker in (1, 2, 3):
        pushes = fabric.sent(src=worker, kind=UPDATE)
        assert {m.dst for m in pushes} == {0}  # a worker talks to the server only
        assert [m.iteration for m in pushes] == list(range(1, 9))  # one push per step, tagged with its count
        answers = fabric.sent(src=0, dst=worker, kind=UPDATE)
        assert len(answers) == len(pushes), (worker, len(answers), len(pushes))  # each push answered, to it
    assert not [m for m in fabric.log if m.src != 0 and m.dst != 0]  # no worker-to-worker message
    assert error is None, error
    assert all(torch.equal(r, results[0]) for r in results)  # every worker holds the server's model
