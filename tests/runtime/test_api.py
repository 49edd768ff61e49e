"""The PyTorch-facing API: optimizer hook, context manager, state_dict, buffers, mixed dtypes,
process_group subgroups (multi-process, gloo, known answers)."""

import socket

import pytest
import torch
import torch.distributed as dist
from torch import nn

import hetrain
from hetrain.jobs.local_job import run_local
from hetrain.runtime.flat_state import FlatState


def _ring_expected(rank: int, n: int) -> float:
    return (rank + (rank - 1) % n + (rank + 1) % n) / 3  # the 4-ring's Metropolis weights are 1/3


def _hooked(ctx):
    model = nn.Linear(1, 1, bias=False).double()
    with torch.no_grad():
        model.weight.fill_(float(ctx.rank))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # no learning: only the averaging moves it
    with hetrain.DPSGD(model, optimizer) as sync:
        model(torch.ones(1, 1, dtype=torch.float64)).sum().backward()
        optimizer.step()  # the post-hook synchronises
        after_step = model.weight.item()
    hooks_left = len(optimizer._optimizer_step_post_hooks)
    return after_step, sync.stats.iterations, hooks_left, model.weight.item()


@pytest.mark.contract
def test_the_optimizer_step_post_hook_synchronises_and_the_block_ends_in_consensus(processes):
    results = run_local(_hooked, 4, timeout_s=30)
    for rank, (after_step, iterations, hooks_left, final) in enumerate(results):
        assert after_step == pytest.approx(_ring_expected(rank, 4), abs=1e-12)
        assert iterations == 1 and hooks_left == 0
        assert final == pytest.approx(1.5, abs=1e-12)


def _fails_inside(ctx):
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        with hetrain.Prague(model, optimizer, gg="random") as sync:
            port = sync._server.port if sync._server is not None else None
            dist.barrier()  # every worker has connected to the Group Generator
            raise ValueError("the user's loop failed")
    except ValueError:
        pass
    refused = None
    if port is not None:  # rank 0 hosted the Group Generator: its socket must be closed now
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            refused = False
        except OSError:
            refused = True
    return sync._released, len(optimizer._optimizer_step_post_hooks), refused


def test_an_exception_in_the_block_releases_sockets_and_hooks_without_waiting(processes):
    results = run_local(_fails_inside, 3, timeout_s=30, job_timeout_s=60)
    assert all(released and hooks == 0 for released, hooks, _ in results)
    assert results[0][2] is True  # the GG's port no longer accepts connections


def _batchnorm(ctx):
    model = nn.BatchNorm1d(3)
    with torch.no_grad():
        model.running_mean.fill_(float(ctx.rank))
        model.weight.fill_(float(ctx.rank))
    sync = hetrain.DPSGD(model)
    sync.step()
    result = (model.running_mean.tolist(), model.weight.tolist(), int(model.num_batches_tracked))
    sync.finish()
    return result


def test_floating_point_buffers_are_averaged_with_the_parameters(processes):
    results = run_local(_batchnorm, 4, timeout_s=30)
    for rank, (running_mean, weight, tracked) in enumerate(results):
        assert running_mean == pytest.approx([_ring_expected(rank, 4)] * 3)
        assert weight == pytest.approx([_ring_expected(rank, 4)] * 3)
        assert tracked == 0  # integer buffers are counters: left alone


class _Mixed(nn.Module):
    def __init__(self, rank):
        super().__init__()
        self.a = nn.Parameter(torch.full((2,), float(rank), dtype=torch.float64))
        self.b = nn.Parameter(torch.full((3,), float(rank), dtype=torch.float32))
        self.register_buffer("c", torch.full((2,), float(rank), dtype=torch.bfloat16))


def _mixed(ctx):
    model = _Mixed(ctx.rank)
    sync = hetrain.DPSGD(model)
    sync.step()
    dtypes = [str(t.dtype) for t in (model.a, model.b, model.c)]
    values = [model.a.tolist(), model.b.tolist(), model.c.float().tolist()]
    sync.finish()
    return dtypes, values


def test_mixed_dtypes_travel_in_one_buffer_and_come_back_in_their_own_dtype(processes):
    results = run_local(_mixed, 4, timeout_s=30)
    for rank, (dtypes, (a, b, c)) in enumerate(results):
        assert dtypes == ["torch.float64", "torch.float32", "torch.bfloat16"]
        expected = _ring_expected(rank, 4)
        assert a == pytest.approx([expected] * 2, abs=1e-12)
        assert b == pytest.approx([expected] * 3, abs=1e-6)
        assert c == pytest.approx([expected] * 2, abs=2e-2)  # bfloat16 keeps 8 bits of mantissa


def test_flat_state_packs_in_the_widest_dtype_and_round_trips():
    model = _Mixed(3)
    state = FlatState(model)
    assert state.dtype == torch.float64 and state.numel == 7
    flat = state.gather()
    state.scatter(flat * 2)
    assert model.a.tolist() == [6.0, 6.0] and model.c.dtype == torch.bfloat16 and model.c.float().tolist() == [6.0, 6.0]
    with pytest.raises(ValueError, match="elements"):
        state.scatter(flat[:3])


def _subgroup(ctx):
    members = [1, 3]
    group = dist.new_group(members)  # every rank creates it; only the members use it
    model = nn.Linear(1, 1, bias=False).double()
    with torch.no_grad():
        model.weight.fill_(float(ctx.rank))
    if ctx.rank in members:
        with hetrain.DPSGD(model, topology="complete", process_group=group) as sync:
            sync.step()
            after_step = model.weight.item()
        return after_step, model.weight.item()
    return None, model.weight.item()


def test_a_protocol_on_a_subgroup_mixes_only_its_members(processes):
    results = run_local(_subgroup, 4, timeout_s=30)
    assert results[1] == pytest.approx((2.0, 2.0)) and results[3] == pytest.approx((2.0, 2.0))
    assert results[0] == (None, 0.0) and results[2] == (None, 2.0)


def _state(ctx):
    model = nn.Linear(1, 1)
    with hetrain.Hop(model) as sync:
        for _ in range(3):
            sync.step()
        saved = sync.state_dict()
    fresh = hetrain.Hop(nn.Linear(1, 1))
    fresh.load_state_dict(saved)
    restored = (fresh.stats.iteration, fresh.logic.iteration)
    try:
        fresh.load_state_dict({**saved, "protocol": "prague"})
        wrong = None
    except ValueError as exc:
        wrong = str(exc)
    fresh.finish()
    return saved["iteration"], restored, wrong


def test_state_dict_round_trips_and_refuses_another_protocols_state(processes):
    for iteration, restored, wrong in run_local(_state, 3, timeout_s=30):
        assert iteration == 3 and restored == (3, 3)
        assert "cannot be loaded into hop" in wrong


def test_options_are_keyword_only():
    with pytest.raises(TypeError):
        hetrain.Hop(nn.Linear(1, 1), None, "ring")  # noqa - positional settings are refused


@pytest.mark.parametrize("cls", [hetrain.Hop, hetrain.DPSGD])
def test_one_worker_without_torch_distributed_trains_alone(cls):
    """A first try in a notebook: no process group, no store; the protocol steps as one worker (it
    once failed building its peers' group: "store argument cannot be None")."""
    assert not dist.is_initialized()
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.weight.detach().clone()
    with cls(model, optimizer) as sync:
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(8, 4)).sum().backward()
            optimizer.step()
    assert sync.metrics()["iteration"] == 3 and not torch.equal(model.weight, before)


PUBLIC_CLASSES = [("Hop", "HopOptions"), ("DPSGD", "DPSGDOptions"), ("Prague", "PragueOptions"),
                  ("ADPSGD", "ADPSGDOptions"), ("ParameterServer", "PSOptions"), ("AllReduce", "AllReduceOptions")]


@pytest.mark.parametrize("name, options_cls", PUBLIC_CLASSES)
def test_every_setting_is_a_keyword_of_the_def_with_its_field_s_default_and_help_shows_it(name, options_cls):
    """Each field of the class's options and of CommSettings is a keyword-only parameter of its ``__init__``
    itself (what type checkers and IDEs read: no ``**settings``, no generated signature), with the field's
    default; the def's other arguments are the class's own, and help() shows every one of them."""
    import dataclasses
    import inspect
    import pydoc

    from hetrain import protocols  # noqa: F401
    from hetrain.comm.settings import comm_fields
    from hetrain.registry import PROTOCOLS
    from hetrain.runtime.public_signature import _CALLER_ARGS

    cls = getattr(hetrain, name)
    options = next(spec.options for spec in PROTOCOLS.values() if spec.options.__name__ == options_cls)
    expected = {f.name: f.default for f in dataclasses.fields(options) if "help" in f.metadata}
    expected.update({f.name: f.default for f in comm_fields()})
    parameters = inspect.signature(cls.__init__).parameters
    missing = sorted(set(expected) - set(parameters))
    assert not missing, f"{name}.__init__ has no keyword for {missing}: write each out, its default read from the field"
    assert {n: parameters[n].default for n in expected} == expected
    assert all(parameters[n].kind is inspect.Parameter.KEYWORD_ONLY for n in expected)
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    assert "__signature__" not in vars(cls) and inspect.signature(cls) == inspect.signature(cls.__init__).replace(
        parameters=list(parameters.values())[1:])  # help() and IDEs read the def itself
    own = [n for n in parameters if n not in expected and n != "self"]
    assert set(own) <= set(_CALLER_ARGS), f"{name}.__init__ takes {sorted(set(own) - set(_CALLER_ARGS))}, no field's"
    text = pydoc.render_doc(cls, renderer=pydoc.plaintext)
    assert "sync_every: 'int' = 1" in text and "Args:" in text
    assert all(f"{n} (default {d!r}): " in text for n, d in expected.items())
    assert all(f"    {n}: {_CALLER_ARGS[n]}" in text for n in own)


def test_the_keywords_given_reach_the_options_and_comm_settings_and_clash_with_the_objects():
    """A keyword given reaches the protocol's options or its communication settings (D-PSGD's through
    Hop's); one left at its default does not count as given, one given beside its object is refused."""
    from hetrain.comm.settings import CommSettings
    from hetrain.protocols.hop_config import DPSGDOptions, HopOptions

    model = nn.Linear(2, 2)
    with hetrain.Hop(model, None, late_updates="progress", sync_every=3, link="100") as hop:
        assert (hop.options.late_updates, hop.comm.sync_every, hop.comm.link_mbps) == ("progress", 3, "100")
    with hetrain.DPSGD(model, None, topology="complete", sync_every=2) as dpsgd:
        assert (dpsgd.options, dpsgd.comm.sync_every) == (DPSGDOptions(topology="complete"), 2)
    with hetrain.Hop(model, None, options=HopOptions(late_updates="progress"), late_updates="model") as hop:
        assert hop.options.late_updates == "progress"  # "model" is the default: not given
    with pytest.raises(TypeError, match="not both"):
        hetrain.Hop(model, None, options=HopOptions(), backup=1)
    with pytest.raises(TypeError, match="not both"):
        hetrain.DPSGD(model, None, comm=CommSettings(), sync_every=2)
    with pytest.raises(TypeError, match="backup"):
        hetrain.DPSGD(model, None, backup=1)  # Hop's setting, not D-PSGD's


def _allreduce_forward(ctx, through_ddp):
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.full((4, 2), float(ctx.rank + 1))  # each worker its own data
    try:
        with hetrain.AllReduce(model, optimizer) as sync:
            for _ in range(3):
                optimizer.zero_grad()
                (sync.module(x) if through_ddp else model(x)).sum().backward()
                optimizer.step()
            weights = model.weight.detach().flatten().tolist()  # plain lists: a worker's tensor dies with it
    except hetrain.UsageError as exc:
        return str(exc)
    return weights


@pytest.mark.parametrize("through_ddp", [pytest.param(True, marks=pytest.mark.slow), False])  # CI time: every
# other All-Reduce test runs its forward through sync.module, and fails if the check misfires
def test_allreduce_refuses_a_step_whose_forward_bypassed_ddp(processes, through_ddp):
    """The README's loop calls model(x); with AllReduce only sync.module(x) is all-reduced, and the workers
    trained apart with no word (each its own weights until finish() averaged them)."""
    results = run_local(_allreduce_forward, 2, (through_ddp,), timeout_s=30)
    if through_ddp:
        assert results[0] == results[1]
    else:
        assert all("sync.module(x)" in r for r in results)
