"""Tensor partitioning for heterogeneous accelerator arrays (HyPar / AccPar).

Pure planning code: nothing here imports ``torch.distributed``; torch itself is
imported only to trace a model (:mod:`hetrain.planner.trace`) and by the
executable check (:mod:`hetrain.planner.verify`). Entry point: :func:`plan_model`.
"""

from hetrain.planner.api import PlanResult, plan_model

__all__ = ["PlanResult", "plan_model"]
