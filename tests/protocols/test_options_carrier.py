"""The options object is the only carrier of a protocol's settings and rules (issue 26)."""

import re
from pathlib import Path

import pytest
from torch import nn

import hetrain
from hetrain import registry
from hetrain.config import RunConfig
from hetrain.jobs.local_job import run_local
from hetrain.protocols.adpsgd_pairing import ADPSGDOptions
from hetrain.protocols.allreduce_options import AllReduceOptions
from hetrain.protocols.hop_config import DPSGDOptions, HopOptions
from hetrain.protocols.options import OptionError, ProtocolOptions
from hetrain.protocols.prague_options import PragueOptions
from hetrain.protocols.ps_logic import PSOptions
from hetrain.topology import make_topology

HETRAIN = Path(hetrain.__file__).parent


@pytest.mark.parametrize("options, on_failure, respawns", [
    (AllReduceOptions(), "abort", False),
    (DPSGDOptions(), "continue", True),
    (HopOptions(), "continue", True),
    (PragueOptions(), "continue", True),
    (PragueOptions(gg="static"), "abort", False),
    (PragueOptions(gg_shards=2), "continue", False),
    (ADPSGDOptions(), "continue", True),
    (PSOptions(), "continue", True),  # a joiner's first push is empty: the server answers the global model
])
def test_each_protocols_failure_rules_are_methods_of_its_options(options, on_failure, respawns):
    assert isinstance(options, ProtocolOptions)
    assert options.default_on_failure() == on_failure and options.supports_respawn() == respawns
    options.check_on_failure("abort")
    if on_failure == "abort":
        with pytest.raises(OptionError):
            options.check_on_failure("continue")
    if not respawns:
        with pytest.raises(OptionError):
            options.check_on_failure("respawn")
    else:
        options.check_on_failure("respawn")


def test_only_prague_asks_for_more_than_one_group_generator_endpoint_or_computes_its_groups_locally():
    assert PragueOptions(gg_shards=3).scheduler_endpoints() == 3 and PragueOptions().scheduler_endpoints() == 1
    assert PragueOptions(gg="static").local_schedule and not PragueOptions().local_schedule
    assert not ADPSGDOptions().local_schedule and HopOptions().scheduler_endpoints() == 1


def test_a_run_config_resolves_its_spec_and_options_once(monkeypatch):
    calls = []
    real = registry.get_spec
    monkeypatch.setattr(registry, "get_spec", lambda name: calls.append(name) or real(name))
    config = RunConfig(protocol="prague", num_workers=8, iterations=3, options={"gg": "random"}).validate()
    options = config.protocol_options()
    assert config.protocol_options() is options and config.resolved_on_failure() == "continue"
    assert config.protocol_spec.make_scheduler(8, options) is not None
    assert calls == ["prague"]
    assert config.replace(num_workers=4).protocol_options() is not options  # a new config resolves afresh


def _built(ctx):
    """Each public class from keywords (or the spec from an object): the options object it holds."""
    model = nn.Linear(2, 2)
    ring = make_topology("ring", 2)
    given = PragueOptions(gg="buffer")
    built = {}
    for key, make in (
        ("prague", lambda: hetrain.Prague(model, gg="random", group_size=2)),
        ("prague-defaults", lambda: hetrain.Prague(model)),
        ("ps", lambda: hetrain.ParameterServer(model, staleness=2)),
        ("adpsgd", lambda: hetrain.ADPSGD(model, communicator_cache=7)),
        ("hop", lambda: hetrain.Hop(model, topology=ring, max_ig=4)),
        ("dpsgd", lambda: hetrain.DPSGD(model)),
        ("spec", lambda: registry.get_spec("prague").build(model, None, given, seed=3, timeout_s=30.0)),
    ):
        with make() as sync:
            built[key] = sync.options
            if key == "hop":
                built["hop-topology"] = sync.topology is ring and sync.config.max_ig == 4
            if key == "spec":
                built["spec-same-object"] = sync.options is given
    return built


def test_the_public_classes_build_their_options_once_and_the_spec_passes_its_object_through(processes):
    for built in run_local(_built, 2, timeout_s=30, job_timeout_s=120):
        assert built["prague"] == PragueOptions(gg="random", group_size=2)
        assert built["prague-defaults"] == PragueOptions()  # the defaults are the options class's
        assert built["ps"] == PSOptions(staleness=2) and built["adpsgd"] == ADPSGDOptions(communicator_cache=7)
        assert built["hop"].max_ig == 4 and built["hop-topology"] and built["dpsgd"] == DPSGDOptions()
        assert built["spec"] == PragueOptions(gg="buffer") and built["spec-same-object"]


def test_keyword_settings_and_an_options_object_do_not_mix_and_unknown_settings_are_refused():
    model = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="not both"):
        hetrain.Prague(model, options=PragueOptions(), gg="random")
    with pytest.raises(TypeError, match="unexpected keyword argument 'backup'"):
        hetrain.DPSGD(model, backup=1)
    with pytest.raises(TypeError, match="must be a PSOptions"):
        hetrain.ParameterServer(model, options=HopOptions())


def test_the_spec_refuses_another_protocols_options():
    with pytest.raises(TypeError, match="hop takes HopOptions"):
        registry.get_spec("hop").build(nn.Linear(2, 2), None, PSOptions())


def test_generic_code_names_no_group_generator_mode():
    """``gg ==`` and the static mode's name live in protocols/ (Prague's files) only."""
    pattern = re.compile(r"\bgg(_mode)?\s*[!=]=|[!=]=\s*[\"']static[\"']")
    offenders = [f"{path.relative_to(HETRAIN)}:{n}" for path in HETRAIN.rglob("*.py")
                 if "protocols" not in path.relative_to(HETRAIN).parts
                 for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []
