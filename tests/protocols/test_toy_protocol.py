"""A toy protocol added through the registry alone, as docs/concepts/protocol-anatomy.md says a protocol is put together.

One options class (its setting and its rule), one runtime shell, one simulated
shell and one registry entry; nothing else in hetrain is touched, yet its option
becomes a flag, travels in a RunConfig, is checked there, and reaches the pure
logic in the runtime and in the simulator as the one options object.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest
from torch import nn

from hetrain import registry
from hetrain.commands.run_options import add_protocol_options, protocol_values
from hetrain.config import RunConfig
from hetrain.protocols.options import TOLERANT, OptionError, ProtocolOptions, check_at_least, option
from hetrain.registry import ProtocolSpec
from hetrain.runtime.protocol import SyncProtocol
from hetrain.sim.runner import simulate

SEEN_BY_SIMULATOR: list = []


# -- 1. the options class: the setting (default and help written once) and the protocol's rules --------
@dataclass(frozen=True)
class ToyOptions(ProtocolOptions):
    """The toy's settings: average every ``every`` steps."""

    every: int = option(2, help="toy: average every N steps (default 2)")

    def validate(self, num_workers: int) -> ToyOptions:
        check_at_least("every", self.every, 1)
        return self

    def default_on_failure(self) -> str:
        return "abort"

    def check_on_failure(self, on_failure: str) -> None:
        if on_failure in TOLERANT:
            raise OptionError("toy cannot route around a death: use {on_failure} abort")


def averages_at(iteration: int, options: ToyOptions) -> bool:
    """The toy's pure logic: whether iteration ``iteration`` ends with an average."""
    return iteration % options.every == 0


# -- 2. the runtime shell: takes the options object as options= ------------------------------------
class ToyProtocol(SyncProtocol):
    name = "toy"

    def __init__(self, model, optimizer=None, *, options: ToyOptions, **runtime):
        super().__init__(model, optimizer, **runtime)
        self.options = options
        self.averages = 0

    def _sync(self) -> None:
        self.averages += averages_at(self.stats.iteration, self.options)  # (one worker: nothing to average)


# -- 3. the simulated shell: factory(setup, options, seed) ----------------------------------------------
def make_toy_sim(setup, options, seed):
    from hetrain.sim.allreduce_sim import AllReduceSim

    SEEN_BY_SIMULATOR.append(options)
    return AllReduceSim(setup)  # the toy's timing: a synchronous average every step


# -- 4. the registry entry ---------------------------------------------------------------------------
@pytest.fixture
def toy(monkeypatch):
    spec = ProtocolSpec("toy", "a toy: averages every N steps", ToyOptions, f"{__name__}:ToyProtocol",
                        f"{__name__}:make_toy_sim")
    monkeypatch.setitem(registry.PROTOCOLS, "toy", spec)
    SEEN_BY_SIMULATOR.clear()
    return spec


def test_the_toys_option_is_a_flag_and_travels_to_the_runtime_as_one_object(toy):

    parser = argparse.ArgumentParser()
    add_protocol_options(parser)
    values = protocol_values(parser.parse_args(["--every", "3"]))
    assert values == {"every": 3} and registry.protocols_using("every") == ["toy"]
    config = RunConfig(protocol="toy", num_workers=1, iterations=6, options=values).validate()
    options = config.protocol_options()
    assert options == ToyOptions(every=3) and config.protocol_options() is options  # resolved once
    assert config.protocol_spec is toy and config.resolved_on_failure() == "abort"
    sync = toy.build(nn.Linear(2, 2), None, options, timeout_s=5.0, on_failure=config.resolved_on_failure())
    assert isinstance(sync, ToyProtocol) and sync.options is options
    for _ in range(6):
        sync.step()
    sync.finish()
    assert sync.averages == 2  # iterations 3 and 6


def test_the_toys_rules_and_checks_are_its_options_classs(toy):
    with pytest.raises(OptionError, match="toy cannot route around a death"):
        RunConfig(protocol="toy", iterations=1, on_failure="continue").validate()
    with pytest.raises(OptionError, match="every must be >= 1"):
        RunConfig(protocol="toy", iterations=1, options={"every": 0}).validate()
    with pytest.raises(OptionError, match="toy takes no option 'backup'"):
        RunConfig(protocol="toy", iterations=1, options={"backup": 1}).validate()


def test_the_simulator_gets_the_same_options_object(toy):
    config = RunConfig(protocol="toy", num_workers=4, iterations=5, options={"every": 4})
    record = simulate(config)
    assert SEEN_BY_SIMULATOR == [ToyOptions(every=4)] and record["protocol"] == "toy"
