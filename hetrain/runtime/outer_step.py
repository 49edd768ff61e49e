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
"""

from __future__ import annotations

import torch

from hetrain.runtime.flat_state import FlatState


class OuterStep:
    """Steps the anchor with ``optimizer`` on the pseudo-gradient; see the module docstring."""

    def __init__(self, model: torch.nn.Module, state: FlatState, optimizer: torch.optim.Optimizer):
        self.params = [p for p in model.parameters() if p.requires_grad]
        stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
        if not stepped or any(id(p) not in stepped for p in self.params):
            raise ValueError("the outer optimizer must be built over the model's parameters "
                             "(e.g. torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True))")
        self.state = state
        self.optimizer = optimizer
        self.anchor: list[torch.Tensor] | None = None
        self.steps = 0

    def capture(self) -> None:
        """Take the model as it is now as the anchor (start of training, a replacement's adopted model)."""
        self.anchor = [p.detach().clone() for p in self.params]

    def capture_if_unset(self) -> None:
        if self.anchor is None:
            self.capture()

    @torch.no_grad()
    def apply(self) -> None:
        """The model holds the exchange's average: replace its parameters by the stepped anchor."""
        if self.anchor is None:
            self.capture()
            return
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
        """The stepped anchor for a flat ``average`` (a delayed exchange's result), leaving the model as it was."""
        live = self.state.gather()
        self.state.scatter(average)
        self.apply()
        stepped = self.state.gather()
        self.state.scatter(live)
        return stepped

    def state_dict(self) -> dict:
        return {"anchor": [a.cpu() for a in self.anchor] if self.anchor is not None else None,
                "optimizer": self.optimizer.state_dict(), "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        if state.get("anchor") is not None:
            self.anchor = [a.to(p.device, p.dtype) for a, p in zip(state["anchor"], self.params)]
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state.get("steps", 0))
