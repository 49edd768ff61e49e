"""A communication setting is one field of CommSettings: nothing else is touched, yet it becomes a flag,
travels in a RunConfig, enters the resume fingerprint and the metrics record, and reaches a protocol shell
(by ``comm=``) and the simulator as the one object (docs/concepts/protocol-anatomy.md, issue 39). As a keyword
of the public classes it is one more line in each ``def`` (docs/decisions/keywords-in-each-def.md).

The toy setting below is declared the way a real one is (a field with ``comm_option``); the test swaps the
class in where the code looks it up (``hetrain.comm.settings``), as a new field would be found there.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist

import hetrain
from hetrain.comm import settings
from hetrain.comm.settings import CommSettings, comm_option
from hetrain.commands.run_options import add_comm_options, comm_values
from hetrain.config import RunConfig
from hetrain.jobs.checkpoint import fingerprint
from hetrain.sim.runner import simulate


@dataclass(frozen=True)
class ToyComm(CommSettings):
    toy_rounds: int = comm_option(3, help="toy: rounds per exchange (default 3)")

    def validate(self, num_workers: int | None = None) -> ToyComm:
        if self.toy_rounds < 1:
            raise settings.OptionError(f"{{toy_rounds}} must be >= 1, got {self.toy_rounds}")
        return super().validate(num_workers)


@pytest.fixture
def toy_setting(monkeypatch):
    monkeypatch.setattr(settings, "CommSettings", ToyComm)


def test_one_field_is_a_flag_a_config_entry_a_fingerprint_and_a_record(toy_setting):
    parser = argparse.ArgumentParser()
    add_comm_options(parser, RunConfig())
    args = parser.parse_args(["--toy-rounds", "5", "--sync-every", "4"])
    config = RunConfig(protocol="hop", num_workers=2, iterations=4, comm=comm_values(args)).validate()
    assert config.comm == {"toy_rounds": 5, "sync_every": 4}
    assert config.comm_settings().toy_rounds == 5
    assert fingerprint(config)["toy_rounds"] == 5  # state=True by default: a resume must match
    assert config.record()["toy_rounds"] == 5
    with pytest.raises(settings.OptionError, match="toy_rounds"):
        RunConfig(protocol="hop", num_workers=2, iterations=4, comm={"toy_rounds": 0}).validate()


def test_one_field_reaches_the_shell_and_the_simulator(loopback, toy_setting, tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        model = torch.nn.Linear(2, 1)
        given = hetrain.DPSGD(model, None, topology="complete", comm=settings.CommSettings(toy_rounds=7))
        assert given.comm.toy_rounds == 7
        given.close()
        with pytest.raises(TypeError, match="toy_rounds"):  # a keyword is one more place: each public class's
            hetrain.DPSGD(model, None, toy_rounds=7)  # def names it (tests/runtime/test_api.py asks for it)
        config = RunConfig(protocol="dpsgd", num_workers=1, iterations=2, comm={"toy_rounds": 6}).validate()
        built = config.protocol_spec.build(model, None, config.protocol_options(), comm=config.comm_settings())
        assert built.comm.toy_rounds == 6  # the one object, whole
        built.close()
    finally:
        dist.destroy_process_group()
    metrics = simulate(RunConfig(protocol="hop", num_workers=4, iterations=3, comm={"toy_rounds": 2}))
    assert metrics["toy_rounds"] == 2


def test_every_setting_has_a_flag_help_and_a_default_that_changes_nothing():
    fields = dataclasses.fields(CommSettings)
    assert all(f.metadata["help"] for f in fields)
    flags = [settings.flag_of(f) for f in fields]
    assert len(set(flags)) == len(flags) and "--compress" in flags
    assert CommSettings().default


def test_the_outer_defaults_follow_the_optimizer_inside():
    """SlowMo's lr 1 and momentum 0.5 with SGD inside, DiLoCo's 0.7 and 0.9 with AdamW (or none known); a value
    given wins; the run's record, its fingerprint and the protocol's own optimizer all hold the resolved values."""
    import torch

    import hetrain
    from hetrain.config import RunConfig
    from hetrain.jobs.checkpoint import comm_fingerprint

    def outer(workload, **comm):
        settings = RunConfig(workload=workload, comm={"outer_optimizer": "nesterov", **comm}).comm_settings()
        return settings.as_dict()["outer_lr"], settings.as_dict()["outer_momentum"]

    assert outer("mlp") == (1.0, 0.5)  # the digits MLP: SGD inside
    assert outer("lm") == (0.7, 0.9)  # the byte-level LM: AdamW inside
    assert outer("mlp", outer_lr=0.7) == (0.7, 0.5) and outer("lm", outer_momentum=0.5) == (0.7, 0.5)
    config = RunConfig(workload="mlp", comm={"outer_optimizer": "nesterov"})
    assert comm_fingerprint(config.comm_settings())["outer_momentum"] == 0.5
    assert RunConfig(workload="mlp").comm_settings().outer_lr is None  # no outer optimizer: nothing filled in

    def built(optimizer_class, **comm):
        model = torch.nn.Linear(3, 1)
        sync = hetrain.DPSGD(model, optimizer_class(model.parameters(), lr=0.1) if optimizer_class else None,
                             outer_optimizer="nesterov", sync_every=2, **comm)
        group = sync._outer.optimizer.param_groups[0]
        sync.close()
        return group["lr"], group["momentum"], group["nesterov"]

    assert built(torch.optim.SGD) == (1.0, 0.5, True)
    assert built(torch.optim.AdamW) == (0.7, 0.9, True)
    assert built(None) == (0.7, 0.9, True)
    assert built(torch.optim.SGD, outer_lr=0.7, outer_momentum=0.9) == (0.7, 0.9, True)
