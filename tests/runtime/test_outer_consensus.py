"""The outer step and weighted consensus off the complete graph, on real multi-process jobs (issue 36).

Every worker here starts from a different model or trains on different data: a test whose workers
agree from the start passes with the communication removed.
"""

import time

import pytest
import torch
from comm_models import Quadratic, _make
from torch import nn

import hetrain
from hetrain.jobs.local_job import run_local
from hetrain.testing.consensus_jobs import NESTEROV, auto_gossip, gossip_only, momentum_after_progress


def _spread(models: torch.Tensor) -> float:
    return float((models - models.mean(0)).norm())


# ----- no progress: the outer momentum must not act on the workers' disagreement ---------------------
@pytest.mark.parametrize("topology", ["exponential", "torus", "prague"])
def test_outer_nesterov_without_progress_is_plain_gossip_off_the_complete_graph(processes, topology):
    """Before issue 36 the spread fell only to 2.4e-3 (exponential) and 8.9e-8 (torus) of its start, and
    Prague's groups with each worker's own anchor to 0.04."""
    results = run_local(gossip_only, 8, (topology, 60, True, True), timeout_s=60)  # Prague: 60 groups each
    starts = torch.stack([torch.from_numpy(s) for s, _ in results])
    models = torch.stack([torch.from_numpy(m) for _, m in results])
    # plain gossip's rate: a fixed graph reaches 1e-9 in 60 exchanges; Prague's pairs (formed as workers
    # arrive), every worker in 60 groups or more, to 1e-4 (each anchor its own, before issue 36: 0.04)
    assert _spread(models) <= (1e-9 if topology != "prague" else 1e-4) * _spread(starts)
    assert torch.allclose(models.mean(0), starts.mean(0), atol=1e-9)  # and the mean is kept


# ----- the complete graph: DiLoCo's trajectory, workers on their own data -----------------------------
H_DILOCO, EXCHANGES = 4, 5


def _inner(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def _diloco_reference(workers: int) -> list[torch.Tensor]:
    """DiLoCo (Douillard et al., 2023) itself: one shared anchor, each worker's H inner steps on its own
    data, the mean pseudo-gradient, torch's SGD(nesterov) on the anchor; the anchor after each exchange."""
    anchor = Quadratic(0)
    outer = torch.optim.SGD(anchor.parameters(), **NESTEROV)
    replicas = [Quadratic(0) for _ in range(workers)]
    inners = [_inner(r) for r in replicas]
    trajectory, step = [], 0
    for _ in range(EXCHANGES):
        for rank, (replica, inner) in enumerate(zip(replicas, inners)):
            with torch.no_grad():
                replica.w.copy_(anchor.w)
            for k in range(H_DILOCO):
                inner.zero_grad()
                replica.loss(step + k, rank).backward()
                inner.step()
        step += H_DILOCO
        mean = torch.stack([r.w.detach() for r in replicas]).mean(0)
        outer.zero_grad()
        anchor.w.grad = anchor.w.detach() - mean
        outer.step()
        trajectory.append(anchor.w.detach().clone())
    return trajectory


def _complete_graph(ctx, protocol):
    model = Quadratic(0)
    inner = _inner(model)
    outer = torch.optim.SGD(model.parameters(), **NESTEROV)
    sync = {"dpsgd": lambda: hetrain.DPSGD(model, inner, topology="complete", sync_every=H_DILOCO,
                                           outer_optimizer=outer),
            "hop": lambda: hetrain.Hop(model, inner, topology="complete", backup=0, staleness=0, skip_threshold=0,
                                       max_ig=2, sync_every=H_DILOCO, outer_optimizer=outer)}[protocol]()
    trajectory = []
    for exchange in range(EXCHANGES):
        for k in range(H_DILOCO):
            inner.zero_grad()
            model.loss(exchange * H_DILOCO + k, ctx.rank).backward()  # this worker's own data
            inner.step()
        trajectory.append(model.w.detach().clone().numpy())
    sync.finish()
    return trajectory


@pytest.mark.parametrize("protocol", ["dpsgd", "hop"])
def test_on_the_complete_graph_every_worker_follows_diloco(processes, protocol):
    reference = _diloco_reference(4)
    for trajectory in run_local(_complete_graph, 4, (protocol,), timeout_s=60):
        for got, expected in zip(trajectory, reference):
            assert torch.allclose(torch.from_numpy(got), expected, rtol=0, atol=1e-12)
    first_local = Quadratic(0)  # the reference moves: the outer steps are not a no-op
    assert float((reference[-1] - first_local.w.detach()).abs().max()) > 0.1


# ----- local_work="auto": consensus goes to the steps-weighted mean -----------------------------------
@pytest.mark.parametrize("topology", ["ring", "torus", "exponential", "prague"])
def test_auto_local_work_gossip_converges_to_the_steps_weighted_mean(processes, topology):
    """Before issue 36 each row was rescaled by steps: ring of 8, consensus -0.4475 where the
    steps-weighted mean was -0.3807 and the plain mean -0.2006. The exponential graph is directed:
    its weights go by one circulation (``weights_by_circulation``), the steps read from the speed board."""
    results = run_local(auto_gossip, 8, (topology, 150), timeout_s=60)
    starts = torch.stack([torch.from_numpy(s) for s, _, _ in results])
    models = torch.stack([torch.from_numpy(m) for _, m, _ in results])
    steps = torch.tensor([float(s) for _, _, s in results], dtype=torch.float64)
    weighted = (steps[:, None] * starts).sum(0) / steps.sum()
    assert _spread(models) < 1e-6 * _spread(starts)
    assert torch.allclose(models.mean(0), weighted, rtol=0, atol=1e-6)
    assert not torch.allclose(weighted, starts.mean(0), atol=1e-3)  # the weighting matters here


# ----- the anchor: the model the first step starts from, and loaded weights ---------------------------
def _loaded_after_wrapping(ctx, how):
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    inner = torch.optim.SGD(model.parameters(), lr=0.0)  # no progress: the weight must stay where it is put
    outer = torch.optim.SGD(model.parameters(), **NESTEROV)
    sync = hetrain.DPSGD(model, inner, topology="ring", sync_every=2, outer_optimizer=outer)
    loaded = torch.full((1, 1), 5.0)
    if how == "load_state_dict":
        model.load_state_dict({"weight": loaded})
    else:  # written in place before the first step (as a framework restoring weights may)
        with torch.no_grad():
            model.weight.copy_(loaded)
    seen = []
    for _ in range(20):
        inner.zero_grad()
        model(torch.ones(1, 1)).sum().backward()
        inner.step()
        seen.append(float(model.weight))
    if how == "load_state_dict":  # mid-run as well, then sync.reanchor() after a write of its own
        with torch.no_grad():
            model.weight.fill_(-2.0)
        sync.reanchor()
        for _ in range(6):
            inner.zero_grad()
            model(torch.ones(1, 1)).sum().backward()
            inner.step()
            seen.append(float(model.weight))
    sync.finish()
    return seen


@pytest.mark.parametrize("how", ["load_state_dict", "in_place_before_the_first_step"])
def test_weights_loaded_into_a_wrapped_model_are_the_anchor_not_progress(processes, how):
    """Before issue 36 the anchor was the model at construction: the weight went 5.0 -> 24.0."""
    for seen in run_local(_loaded_after_wrapping, 2, (how,), timeout_s=30):
        assert seen[:20] == [5.0] * 20
        if how == "load_state_dict":
            assert seen[20:] == [-2.0] * 6


# ----- the parameter server and AD-PSGD end where DiLoCo ends ----------------------------------------
# weight 1, gradient 2, inner lr 1, outer SGD lr 2, H = 6, 15 steps, identical replicas: each exchange's
# pseudo-gradient is 12 and moves the anchor by -24; the last 3 steps come after the last exchange
FIXTURE = [-1, -3, -5, -7, -9, -23, -25, -27, -29, -31, -33, -47, -49, -51, -53]


def _fixture(ctx, protocol):

    model = nn.Linear(1, 1, bias=False).double()
    with torch.no_grad():
        model.weight.fill_(1.0)
    inner = torch.optim.SGD(model.parameters(), lr=1.0)
    outer = torch.optim.SGD(model.parameters(), lr=2.0)
    sync = _make(protocol, model, inner, sync_every=6, outer_optimizer=outer)
    seen = []
    for step in range(15):
        if protocol == "adpsgd" and ctx.rank % 2 and step % 6 == 5:
            time.sleep(0.5)  # the passive syncs after the active queued its pair (see test_comm_protocols)
        inner.zero_grad()
        (2 * model.weight).sum().backward()
        inner.step()
        seen.append(float(model.weight))
    sync.finish()
    return seen, float(model.weight)


@pytest.mark.parametrize("protocol", ["dpsgd", "hop", "prague", "adpsgd", "ps"])
def test_every_protocol_ends_with_the_last_outer_step_and_the_steps_after_it(processes, protocol):
    """Before issue 36 the parameter server ended at -35: its final model was the server's copy, without
    the last outer step or the steps after the last exchange."""
    for seen, final in run_local(_fixture, 2, (protocol,), timeout_s=30):
        assert seen == FIXTURE
        assert final == -53


def _passive_alone(ctx):

    model = nn.Linear(1, 1, bias=False).double()
    with torch.no_grad():
        model.weight.fill_(1.0)
    inner = torch.optim.SGD(model.parameters(), lr=1.0)
    outer = torch.optim.SGD(model.parameters(), lr=2.0)
    sync = _make("adpsgd", model, inner, sync_every=6, outer_optimizer=outer)
    if ctx.rank == 0:
        time.sleep(1.5)  # the active starts late: the passive's first sync finds no pair queued for it
    seen = []
    for step in range(6 if ctx.rank == 0 else 12):
        if ctx.rank == 1 and step == 11:
            time.sleep(3.0)  # its second sync comes after the active queued the pair: that one averages
        inner.zero_grad()
        (2 * model.weight).sum().backward()
        inner.step()
        seen.append(float(model.weight))
    sync.finish()
    return seen, sync.metrics()["outer_steps"]


def test_an_adpsgd_sync_that_averages_nothing_takes_no_outer_step(processes):
    """Before issue 36 the passive stepped its own unaveraged model: -23 after its first 6 steps."""
    (_, active_outer), (passive, passive_outer) = run_local(_passive_alone, 2, timeout_s=30)
    assert passive[5] == -11  # 6 local steps, no exchange, no outer step
    assert passive_outer == 1 and active_outer == 1  # the one pair both ran


# ----- the outer momentum mixed beside the model (Hop, D-PSGD) ---------------------------------------
@pytest.mark.parametrize("protocol,compression", [("dpsgd", "none"), ("hop", "none"), ("hop", "int8")])
def test_the_outer_momentum_is_mixed_as_the_models_are(processes, protocol, compression):
    """Each worker trains toward its own target (opposite ends for ranks 0 and 7), then stops making
    progress: its momentum only decays (x0.9 an exchange) and, mixed, agrees with its neighbours'.
    Unmixed, each buffer kept its own direction: a spread 49x the mean's size (2e-5x mixed; 0.33x with
    the momentum one bit a value, under int8, measured). Compressed, one update is the model in int8 and
    the momentum in one bit a value."""
    results = run_local(momentum_after_progress, 8, (protocol, compression, 60), timeout_s=60)
    momenta = torch.stack([torch.from_numpy(m) for m, _ in results])
    mean = float(momenta.mean(0).norm())
    assert mean > 0  # progress made a momentum that is still there
    assert _spread(momenta) <= (1e-3 if compression == "none" else 1.0) * mean
    nbytes = results[0][1]
    if compression == "int8":  # 8 values: a float32 scale each, then 8 bytes and 8 bits
        assert nbytes == (4 + 8) + (4 + 1)
    else:
        assert nbytes == 2 * 8 * 8  # float64 model and momentum


def test_a_loaded_outer_optimizer_keeps_its_momentum_in_the_buffers_the_protocol_mixes():
    """``load_state_dict`` builds new momentum tensors (a resume, a user's own load): they are copied at
    once into the buffers the flat state mixes (what an exchange or ``finish()`` averages next is the
    loaded momentum), and the next outer step steps those."""
    from hetrain.runtime.outer_step import OuterStep

    model = nn.Linear(2, 1, bias=False).double()
    outer = torch.optim.SGD(model.parameters(), **NESTEROV)
    step = OuterStep(model, outer)
    mixed = step.mix_momentum()
    saved = {"state": {0: {"momentum_buffer": torch.tensor([[1.0, -2.0]], dtype=torch.float64)}},
             "param_groups": outer.state_dict()["param_groups"]}
    outer.load_state_dict(saved)
    assert outer.state[model.weight]["momentum_buffer"] is mixed[0]
    assert torch.equal(mixed[0], torch.tensor([[1.0, -2.0]], dtype=torch.float64))
    outer.state[model.weight]["momentum_buffer"] = mixed[0].clone()  # state replaced some other way
    step.capture()
    with torch.no_grad():
        model.weight.sub_(torch.tensor([[0.5, 0.5]], dtype=torch.float64))  # progress: pseudo-gradient 0.5
    step.step()
    assert outer.state[model.weight]["momentum_buffer"] is mixed[0]
    assert torch.equal(mixed[0], torch.tensor([[0.9 * 1.0 + 0.5, 0.9 * -2.0 + 0.5]], dtype=torch.float64))
    outer.load_state_dict({"state": {}, "param_groups": saved["param_groups"]})  # a state without momentum
    step.capture()
    step.step()  # no progress: a zero momentum stays zero (the old one would have decayed to 0.9x)
    assert float(mixed[0].abs().max()) == 0.0
    assert OuterStep(model, torch.optim.Adam(model.parameters())).mix_momentum() == []  # Adam's stays its own


def _ps_resumed_from_rounds_apart(ctx):
    """What --resume restores when rank 0's file holds the server model of a later round than worker 1's
    own anchor (checkpoints on per-worker timers, or a worker dead before the last one); no progress after."""
    model = nn.Linear(4, 1, bias=False).double()
    inner = torch.optim.SGD(model.parameters(), lr=0.0)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    sync = hetrain.ParameterServer(model, inner, staleness=0, sync_every=2, outer_optimizer=outer)
    own_anchor = 5.0 if ctx.rank == 0 else 4.0
    model.load_state_dict({"weight": torch.full((1, 4), own_anchor, dtype=torch.float64)})
    state = {"protocol": "ps", "iteration": 20, "iterations": 20, "local_steps": 0,
             "outer": {"anchor": [torch.full((1, 4), own_anchor, dtype=torch.float64)],
                       "optimizer": outer.state_dict(), "steps": 10}}
    if ctx.rank == 0:
        state.update(server_model=torch.full((4,), 5.0, dtype=torch.float64), pushes=[10, 10])
    sync.load_state_dict(state)
    seen = []
    for _ in range(4):
        inner.zero_grad()
        model(torch.ones(1, 4, dtype=torch.float64)).sum().backward()
        inner.step()
        seen.append(float(model.weight[0, 0]))
    sync.finish()
    return seen


def test_a_resumed_parameter_server_worker_steps_from_the_model_it_pulled(processes):
    """Before: worker 1's anchor (4.0, its own older file) against the pulled server model (5.0) was a
    pseudo-gradient, and with no progress the model went 5.0, 5.0, 5.165, 5.165 and on."""
    for seen in run_local(_ps_resumed_from_rounds_apart, 2, timeout_s=30):
        assert seen == [5.0] * 4


# ----- the anchors one bit a value (Prague, AD-PSGD) --------------------------------------------------
def _anchors_compressed(ctx, protocol):
    """Two workers, each toward its own target, outer Nesterov, int8: the bytes of one group message
    (model and anchors) and the final model."""
    model = nn.Linear(8, 1, bias=False).double()
    target = torch.full((1, 8), 4.0 if ctx.rank else -4.0, dtype=torch.float64)
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    outer = torch.optim.SGD(model.parameters(), **NESTEROV)
    extra = {"gg": "static", "group_size": 2, "preduce_overlap": 0} if protocol == "prague" else {}
    cls = hetrain.Prague if protocol == "prague" else hetrain.ADPSGD
    sync = cls(model, inner, sync_every=2, outer_optimizer=outer, compression="int8", **extra)
    for _ in range(24):
        inner.zero_grad()
        ((model.weight - target) ** 2).sum().backward()
        inner.step()
    nbytes = sync.preduce.codec.payload_nbytes
    sync.finish()
    return nbytes, model.weight.detach().clone().numpy(), sync.metrics()["groups_formed"]


@pytest.mark.parametrize("protocol", ["prague", "adpsgd"])
def test_compressed_groups_send_the_anchors_one_bit_a_value(processes, protocol):
    """The anchors travel beside the model (combine, then adapt); compressed, they go as Hop's mixed
    momentum does, one bit a value with a scale (in int8 they doubled a message: 8 values, (4 + 8) * 2
    bytes). The workers still train and end with one model."""
    results = run_local(_anchors_compressed, 2, (protocol,), timeout_s=60)
    for nbytes, _, _ in results:
        assert nbytes == (4 + 8) + (4 + 1)  # the model: a float32 scale and 8 bytes; the anchors: a scale, 8 bits
    if protocol == "prague":
        assert all(groups > 0 for _, _, groups in results)
    first = results[0][1]
    for _, weights, _ in results:
        assert weights == pytest.approx(first, abs=1e-6)
    assert abs(float(first.mean())) < 1.0 and float(abs(first).max()) > 0  # between the targets, trained
