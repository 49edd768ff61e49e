"""Mutants: deliberately broken protocols, to prove that the tests can fail.

A test that passes whether or not the workers communicate proves nothing about communication.
With ``HETRAIN_MUTANT=no-comm`` in the environment, every worker process that hetrain's local
launcher starts (:func:`hetrain.jobs.worker_process.worker_main`) applies :func:`no_comm` before
it runs: the messages still flow (so nothing waits forever), but no worker's model ever takes
anything from them. Each worker's model changes only by its own optimizer steps:

- the constructor, ``step()``, ``should_stop()`` and ``finish()`` of every protocol class put the
  worker's own model back after they ran (the initial broadcasts of DDP and the parameter server,
  Hop's and D-PSGD's mixing, Prague's and AD-PSGD's group averages and their background ones, the
  parameter server's answer, the final average);
- DDP's gradient hook returns the worker's own gradients, unreduced.

``tests/runtime/test_mutants.py`` (slow set) runs every multi-process protocol test under it and
expects each to fail on one of its assertions.
"""

from __future__ import annotations

import functools
import os

import torch

from hetrain.errors import UsageError

ENV = "HETRAIN_MUTANT"


def apply_from_env() -> None:
    """Apply the mutant ``$HETRAIN_MUTANT`` names, if any (a worker calls this at its start)."""
    name = os.environ.get(ENV)
    if not name:
        return
    if name not in MUTANTS:
        raise UsageError(f"{ENV}={name!r} is no mutant; known: {', '.join(sorted(MUTANTS))}")
    MUTANTS[name]()


def no_comm() -> None:
    """Patch every protocol so that no worker's model takes anything from communication (see the module)."""
    from hetrain.runtime import adpsgd, allreduce, hop, parameter_server, prague  # noqa: F401 (every class)
    from hetrain.runtime.protocol import SyncProtocol

    for cls in _with_subclasses(SyncProtocol):
        if "__init__" in vars(cls):
            cls.__init__ = _constructed_keeping_own_model(vars(cls)["__init__"])
        for name in ("step", "should_stop", "finish"):
            if name in vars(cls):
                setattr(cls, name, _keeping_own_model(vars(cls)[name]))
    allreduce._timed_allreduce_hook = _local_gradients_hook


def _with_subclasses(cls: type) -> list[type]:
    found = [cls]
    for sub in cls.__subclasses__():
        found.extend(_with_subclasses(sub))
    return found


def _keeping_own_model(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        own = self.state.gather().clone()
        try:
            return method(self, *args, **kwargs)
        finally:
            self.state.scatter(own)

    return wrapper


def _constructed_keeping_own_model(init):
    @functools.wraps(init)
    def wrapper(self, model, *args, **kwargs):
        own = [p.detach().clone() for p in model.parameters()]
        try:
            return init(self, model, *args, **kwargs)
        finally:
            with torch.no_grad():
                for p, mine in zip(model.parameters(), own):
                    p.copy_(mine)

    return wrapper


def _local_gradients_hook(timer, bucket):
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


MUTANTS = {"no-comm": no_comm}
