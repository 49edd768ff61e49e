"""The discrete-event simulator: the protocols' own pure logic driven in simulated time.

    from hetrain.config import RunConfig
    from hetrain.sim import simulate
    record = simulate(RunConfig(protocol="hop", num_workers=64, iterations=100, slowdown="every:8:5x"))

See docs/guides/simulator.md for the engine, the network model and the fidelity checks.
"""

from hetrain.sim.network import NetworkParams
from hetrain.sim.runner import SimOptions, simulate

__all__ = ["NetworkParams", "SimOptions", "simulate"]
