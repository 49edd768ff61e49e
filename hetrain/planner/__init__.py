"""Tensor partitioning for heterogeneous accelerator arrays (HyPar / AccPar).

Pure planning code: nothing here imports ``torch.distributed``, and nothing on
the way from a zoo name to a plan imports torch at all. torch is imported to
trace a module (:mod:`hetrain.planner.trace`), and in the worker processes of
the executable checks (:mod:`hetrain.planner.verify`, :mod:`hetrain.planner.execute`,
:mod:`hetrain.planner.profile`). Entry point: :func:`plan_model`; see docs/planner.md.
"""

from hetrain.planner.api import PlanResult, plan_model

__all__ = ["PlanResult", "plan_model"]
