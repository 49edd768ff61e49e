"""Mixing an old update without losing the steps taken since it was sent (``late_updates="progress"``).

Hop averages, at iteration k, neighbours' models of iterations k' <= k (staleness, backup workers'
late updates). A model of iteration k' lags this worker's by the k - k' steps taken since, so mixing
it as it is pulls the worker back: with weight w and lag d, w * d of its own steps lost at every such
average. At equal speeds on a ring with backup 1 (every iteration one fresh and one one-iteration-old
update, weights 1/3) the models advance 3/4 of a step per iteration; measured, Hop's averaged model
needed 1.25-1.5x the samples of D-PSGD's to the same accuracy (docs/decisions/hop-late-updates-progress.md).

The rule: the average is Hop's (a convex combination of the models: the mixing is exactly Hop's),
plus, for each term of iteration k' < k, ``weight * (P_k - P_k')``, where P is the worker's own
progress: the sum of what moved its flat state between one mix and the next send (its optimizer steps,
an outer step, and whatever else travels in the flat state beside the model: the outer momentum,
floating-point buffers such as BatchNorm's running statistics). The steps the old model lacks are put
back; nothing of the workers' disagreement is mixed twice. (Mixing the disagreement at k' instead, ``weight * (x_j,k' - x_i,k')``, keeps the steps as
well but is delayed feedback on the disagreement: with a renormalized weight of 1/2 and lags of a few
iterations it diverged in the simulator, consensus distance 1e16.) The rule is ours, measured, not a
published algorithm with a proof.

:class:`OwnProgress` keeps P by iteration for the runtime and the simulator alike (torch tensors or
numpy arrays: it only adds and subtracts).
"""

from __future__ import annotations


class OwnProgress:
    """A worker's own progress P (the sum of its steps between a mix and the next send), by iteration."""

    def __init__(self, keep: int):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.keep = keep
        self._total = None  # P now (None: nothing recorded yet)
        self._mixed = None  # the model after the last mix: the next send's steps are measured from it
        self._by_iteration: dict[int, object] = {}
        self.compensated = 0  # old terms whose lost steps were put back
        self.uncompensated = 0  # old terms whose P was no longer kept (mixed as they are)

    def sent(self, iteration: int, model, empty=None) -> None:
        """``model`` (as sent for ``iteration``) holds the steps since the last :meth:`mixed`; ``empty()``
        gives a torch buffer to write P into (default: a new array)."""
        if self._mixed is not None:
            step = model - self._mixed if empty is None else empty().copy_(model).sub_(self._mixed)
            if self._total is not None:
                step += self._total
            self._total = step
        elif self._total is None:
            self._total = model * 0
        self._by_iteration[iteration] = self._total
        oldest = iteration - self.keep + 1
        for k in [k for k in self._by_iteration if k < oldest]:
            del self._by_iteration[k]

    def mixed(self, model) -> None:
        """The model after an average (or a skip): the next steps are measured from here."""
        self._mixed = model

    def lost_steps(self, term):
        """``(P_now, P_k')`` for an old ``term`` (add ``term.weight * (P_now - P_k')`` to the average), or None."""
        if term.reference is None:
            return None
        then = self._by_iteration.get(term.reference)
        if then is None or self._total is None:
            self.uncompensated += 1
            return None
        self.compensated += 1
        return self._total, then

