"""The outer optimizer of local-steps training (DiLoCo: Douillard et al., 2023; torchft's ``DiLoCo``).

Between two exchanges a worker takes H local steps from its *anchor* (its
model right after the previous exchange). The exchange averages models as the
protocol does; the averaged *pseudo-gradient* is then ``anchor - average``,
and the outer optimizer, an ordinary ``torch.optim`` optimizer over the
model's parameters, steps the anchor with it::

    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    with hetrain.Hop(model, inner_optimizer, sync_every=16, outer_optimizer=outer) as sync: ...

With SGD of lr 1 and no momentum the new anchor is the average itself (plain
averaging every H steps). Floating-point buffers (BatchNorm's statistics) are
not parameters: they take the average as it is. The gradients the outer step
sets are cleared after it, so the inner optimizer never sees them.

Off the complete graph the workers' anchors differ, and a pseudo-gradient of a
worker's own anchor minus its neighbourhood's average holds their disagreement:
the outer momentum then acts on it, and consensus slows or stalls (issue 36).
So the gossip protocols average the anchors with the same weights as the
models (the anchors travel in the protocol's flat state: ``anchor_tensors``),
and the pseudo-gradient is ``mixed anchor - mixed model``, the neighbourhood's
averaged progress. With no progress it is zero, the momentum stays zero and
consensus is plain gossip; on the complete graph every anchor is the same, so
this is DiLoCo's rule (docs/decisions.md, "The outer step off the complete graph").

The anchor is the model before the first local step (:meth:`capture` at the
first optimizer step, see :class:`~hetrain.runtime.protocol.SyncProtocol`), and
again after weights are loaded into the model (``model.load_state_dict`` runs a
hook that re-anchors; ``sync.reanchor()`` after loading weights any other way).
"""

from __future__ import annotations

import torch

from hetrain.runtime.flat_state import FlatState


class OuterStep:
    """Steps the anchor with ``optimizer`` on the pseudo-gradient; see the module docstring."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.params = [p for p in model.parameters() if p.requires_grad]
        stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
        if not stepped or any(id(p) not in stepped for p in self.params):
            raise ValueError("the outer optimizer must be built over the model's parameters "
                             "(e.g. torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True))")
        self.state: FlatState | None = None  # the protocol's flat state (set by the protocol)
        self.optimizer = optimizer
        self.anchor = [p.detach().clone() for p in self.params]  # updated in place: the flat state holds them
        self.steps = 0
        self.pending_capture = True  # re-anchor at the first optimizer step (weights may be loaded before it)

    @property
    def plain_average(self) -> bool:
        """Whether the step is plain averaging (SGD, lr 1, no momentum, no weight decay): then the new
        anchor is the average whatever the anchors were, and they need not travel."""
        return type(self.optimizer) is torch.optim.SGD and all(
            group["lr"] == 1 and not group["momentum"] and not group["weight_decay"] and not group.get("maximize")
            for group in self.optimizer.param_groups)

    def capture(self) -> None:
        """Take the model as it is now as the anchor (first step, loaded weights, a replacement's model)."""
        with torch.no_grad():
            for anchor, p in zip(self.anchor, self.params):
                anchor.copy_(p)
        self.pending_capture = False

    @torch.no_grad()
    def apply(self) -> None:
        """The model holds the exchange's average (and the anchors, where gossiped, theirs): replace its
        parameters by the anchor stepped with the pseudo-gradient ``anchor - model``."""
        saved = [p.grad for p in self.params]
        for p, anchor in zip(self.params, self.anchor):
            p.grad = anchor - p  # the averaged pseudo-gradient
            p.copy_(anchor)
        with torch.enable_grad():
            self.optimizer.step()
        for p, anchor, grad in zip(self.params, self.anchor, saved):
            anchor.copy_(p)
            p.grad = grad
        self.steps += 1

    def transform(self, average: torch.Tensor) -> torch.Tensor:
        """The stepped flat state for a flat ``average`` (a delayed exchange's result), leaving the model as it was."""
        live = self.state.gather()
        self.state.scatter(average)
        self.apply()
        stepped = self.state.gather()
        self.state.scatter(live)
        return stepped

    def state_dict(self) -> dict:
        return {"anchor": [a.cpu() for a in self.anchor], "optimizer": self.optimizer.state_dict(), "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        if state.get("anchor") is not None:
            with torch.no_grad():
                for anchor, saved in zip(self.anchor, state["anchor"]):
                    anchor.copy_(saved)
            self.pending_capture = False
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state.get("steps", 0))
