"""A checkpoint loaded through HetrainStrategy during a fit (issue 68, item 7): the running protocol takes
its state at once. It was kept for a ``setup`` that had already run: the protocol's part was silently lost."""

import pytest

pytest.importorskip("lightning")

from lightning.pytorch.strategies import DDPStrategy  # noqa: E402

from hetrain.integrations.lightning import HetrainStrategy  # noqa: E402


class RunningProtocol:
    def __init__(self):
        self.loaded = []

    def load_state_dict(self, state):
        self.loaded.append(state)


def test_a_checkpoint_loaded_during_a_fit_reaches_the_running_protocol(monkeypatch):
    state = {"protocol": "hop", "iteration": 17, "iterations": 17, "local_steps": 0}
    monkeypatch.setattr(DDPStrategy, "load_checkpoint", lambda self, path, *a, **k: {"hetrain": state})
    strategy = HetrainStrategy("hop")
    assert strategy.load_checkpoint("before.ckpt")["hetrain"] == state
    assert strategy._resumed == state  # before the fit: taken at setup, once the protocol is built
    strategy._resumed, strategy.sync = None, RunningProtocol()
    strategy.load_checkpoint("during.ckpt")
    assert strategy.sync.loaded == [state] and strategy._resumed is None
