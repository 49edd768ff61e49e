"""Learning-rate schedules that follow the whole job's progress, not one rank's step count.

With batches shared out by speed (:mod:`hetrain.integrations.shared_batches`) a fast rank takes many
more optimizer steps than a slow one, so a schedule stepped once per own step would end early on the
fast rank (OneCycleLR raises past its end) and stay near its start on the slow one. A followed
scheduler's ``step()`` instead catches up with ``target()``, the job's position in the scheduler's
units (each call steps it zero or more times, never past OneCycleLR's ``total_steps``), so every
rank's learning rate is the one a single process would have at that point of the data. The class is
swapped for a subclass (a method stored on the instance would land in its ``state_dict``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

_targets: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # scheduler -> its target()
_classes: dict[type, type] = {}


def follow_job(scheduler, target: Callable[[], int | None]) -> None:
    """Make ``scheduler.step()`` catch up with ``target()`` (None: step as usual, once)."""
    cls = type(scheduler)
    if scheduler in _targets:
        _targets[scheduler] = target
        return
    sub = _classes.get(cls)
    if sub is None:
        sub = _classes[cls] = type(f"JobProgress{cls.__name__}", (cls,), {"step": _step, "__module__": __name__,
                                                                          "_hetrain_base": cls})
    scheduler.__class__ = sub
    _targets[scheduler] = target


def followed(scheduler) -> bool:
    return scheduler in _targets


def _step(self, *args, **kwargs):
    base = type(self)._hetrain_base
    target = _targets[self]() if self in _targets else None
    if target is None or args or kwargs:
        return base.step(self, *args, **kwargs)
    target = min(target, getattr(self, "total_steps", target))  # OneCycleLR refuses to pass its end
    while self.last_epoch < target:
        base.step(self)
    return None
