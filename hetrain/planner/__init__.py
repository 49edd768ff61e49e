"""Tensor partitioning for heterogeneous accelerator arrays (HyPar / AccPar).

Pure planning code: nothing here imports ``torch.distributed``, and nothing on
the way from a zoo name to a plan imports torch at all. torch is imported to
trace a module (:mod:`hetrain.planner.trace`), and in the worker processes of
the executable checks (:mod:`hetrain.planner.verify`, :mod:`hetrain.planner.execute`,
:mod:`hetrain.planner.profile`). Entry points: :func:`plan_model`; :func:`train_with_plan` (local processes, emulated devices) and
:func:`parallelize` (your model under torchrun) train with a plan; see docs/guides/planner.md.
"""

from hetrain.planner.api import PlanResult, plan_model

__all__ = ["PlanResult", "parallelize", "plan_model", "train_with_plan"]


def __getattr__(name):  # the training entry points import torch; planning does not
    if name == "parallelize":
        from hetrain.planner.parallel import parallelize

        return parallelize
    if name == "train_with_plan":
        from hetrain.planner.train import train_with_plan

        return train_with_plan
    raise AttributeError(f"module 'hetrain.planner' has no attribute {name!r}")
