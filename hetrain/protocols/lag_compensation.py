"""Mixing an old update as the disagreement it carries, not as an old model.

Hop averages, at iteration k, neighbours' models of iterations k' <= k (staleness, backup workers'
late updates). A model of iteration k' lags this worker's by the k - k' steps taken since, so mixing
it as it is pulls the worker back: with weight w and lag d, w * d steps lost at every such average.
At equal speeds on a ring with backup 1 (every iteration one fresh and one one-iteration-old update,
weights 1/3) the average advanced 3/4 of a step per iteration; measured, Hop's averaged model needed
1.25-1.5x the samples of D-PSGD's to the same accuracy (docs/decisions.md, "Hop mixes late updates
as disagreement").

The rule (``late_updates="disagreement"``, ``--late-updates disagreement``; Hop's own rule, "model", is the
default: on digits the faster model overfits sooner, docs/decisions.md): a term of iteration k' < k is mixed as ``weight * (update_k' - own_k')``, where ``own_k'``
is this worker's own model as it sent it at k'. The model becomes

    own_k + sum_j w_j * (x_j,k' - x_i,k')

Each correction moves the worker by the disagreement measured at the older iteration, so the steps
taken since are kept and only the difference is mixed: the form of CHOCO-SGD's consensus step (Koloskova
et al., 2019), which mixes differences of copies, ``x_i += gamma * sum_j w_ij (x^_j - x^_i)``, here with
both copies of one iteration. The rule is ours, measured, not a published algorithm with a proof. With every term of iteration k it is Hop's average exactly (D-PSGD, the
complete-graph tests). A newer update (a stand-in after a neighbour skipped) and a term whose
own model is no longer kept are mixed as they are.

:class:`SentModels` keeps a worker's own models by iteration for the runtime and the simulator alike;
a model is held by reference (the runtime's pooled buffers stay busy while kept, so nothing reuses
them).
"""

from __future__ import annotations


class SentModels:
    """A worker's own models as sent, by iteration: the newest ``keep`` iterations."""

    def __init__(self, keep: int):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.keep = keep
        self._models: dict[int, object] = {}
        self.compensated = 0  # old terms mixed as disagreement
        self.uncompensated = 0  # old terms whose own model was not kept (mixed as they are)

    def record(self, iteration: int, model) -> None:
        self._models[iteration] = model
        oldest = max(self._models) - self.keep + 1
        for k in [k for k in self._models if k < oldest]:
            del self._models[k]

    def reference(self, term):
        """The own model ``term`` is to be differenced against, or None (mix the payload as it is)."""
        if term.reference is None:
            return None
        model = self._models.get(term.reference)
        if model is None:
            self.uncompensated += 1
        else:
            self.compensated += 1
        return model

    def clear(self) -> None:
        self._models.clear()
