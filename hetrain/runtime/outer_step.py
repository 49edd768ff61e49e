"""The outer optimizer of local-steps training (DiLoCo: Douillard et al., 2023; torchft's ``DiLoCo``).

Between two exchanges a worker takes H local steps from its *anchor* (its
model right after the previous exchange). At the exchange the worker first
steps its anchor with the outer optimizer, an ordinary ``torch.optim``
optimizer over the model's parameters, on its own *pseudo-gradient*
``anchor - model``; the protocol then averages the stepped models as it
averages models, and the average is the next anchor::

    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    with hetrain.Hop(model, inner_optimizer, sync_every=16, outer_optimizer=outer) as sync: ...

This is *adapt then combine* (the diffusion strategies of Chen and Sayed, 2012):
each worker adapts with its own progress, the exchange combines. For SGD, with or
without (Nesterov) momentum, the update is linear in the pseudo-gradients, so on
the complete graph the average of the stepped anchors is DiLoCo's step on the
averaged pseudo-gradient (every worker's anchor and momentum are the same there).
Off the complete graph the momentum acts on progress, never on the workers'
disagreement: with no progress the pseudo-gradient is zero, the momentum stays
zero and the exchange is plain gossip (docs/decisions/outer-step-off-the-complete-graph.md). Hop, D-PSGD and the parameter server work so.

Hop and D-PSGD also mix the momentum buffers of an SGD outer optimizer as they
mix the models (:meth:`mix_momentum`: the buffers travel in the flat state beside
the model, one bit a value where the model is compressed), so each worker's next
outer step starts from its neighbourhood's momentum as its next interval starts
from its neighbourhood's model. On the complete graph the mixed buffer is DiLoCo's
own (the mean of ``mu m + g_i`` is ``mu m + mean g``), so nothing changes there;
on a ring each worker's unmixed momentum carried its own shard's direction and
held its model 2x later to 95% than no outer optimizer (docs/decisions/outer-momentum-mixed-beside-the-model.md).

Prague's and AD-PSGD's groups change at every exchange, and a momentum of each
worker's own progress there amplifies how unlike the workers' data are (measured:
10x later to 95% on the digits). They *combine, then adapt*: the anchors travel in
the protocol's flat state beside the models (``FlatState(model, extra=anchors)``),
the group averages both, and :meth:`apply` steps the averaged anchor with the
group's averaged pseudo-gradient ``mixed anchor - mixed model``: zero with no
progress, DiLoCo's step on the complete graph. A message is then two models,
or, compressed, the model in its code and the anchors one bit a value (as
Hop's mixed momentum; :func:`hetrain.compression.codecs.make_codec`'s ``head``).

With SGD of lr 1 and no momentum the stepped anchor is the model itself (plain
averaging every H steps). Floating-point buffers (BatchNorm's statistics) are
not parameters: they take the average as it is. The gradients the outer step
sets are cleared after it, so the inner optimizer never sees them.

The anchor is the model the first step starts from (:meth:`capture` at the
first optimizer step, see :class:`~hetrain.runtime.protocol.SyncProtocol`), and
again after weights are loaded into the model (``model.load_state_dict`` runs a
hook that re-anchors; ``sync.reanchor()`` after loading weights any other way).
"""

from __future__ import annotations

import torch


class OuterStep:
    """Steps the model from its anchor with ``optimizer`` on the pseudo-gradient; see the module docstring."""

    state = None  # the protocol's flat state, where it gossips the anchors (see apply)

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.params = [p for p in model.parameters() if p.requires_grad]
        stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
        if not stepped or any(id(p) not in stepped for p in self.params):
            raise ValueError("the outer optimizer must be built over the model's parameters "
                             "(e.g. torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True))")
        self.optimizer = optimizer
        self.anchor = [p.detach().clone() for p in self.params]
        self.steps = 0
        self.pending_capture = True  # re-anchor at the first optimizer step (weights may be loaded before it)
        self.momentum: list[torch.Tensor] = []  # see mix_momentum
        self.load_hook = None  # mix_momentum's hook on the optimizer's load_state_dict (the protocol removes it)

    def mix_momentum(self) -> list[torch.Tensor]:
        """The momentum buffers, for the protocol to mix beside the models (adapt then combine: Hop,
        D-PSGD; see the module docstring), where the optimizer is SGD with momentum and no dampening
        (DiLoCo's): zeros until the first step, which is then torch's own first step (buf = g). Other
        optimizers: none ([]), their state stays each worker's own."""
        groups = self.optimizer.param_groups
        wrapped = getattr(self.optimizer, "optimizer", self.optimizer)  # Accelerate's AcceleratedOptimizer
        if not isinstance(wrapped, torch.optim.SGD) or not all(
                g.get("momentum", 0) > 0 and g.get("dampening", 0) == 0 for g in groups):
            return []
        self.momentum = [torch.zeros_like(p) for p in self.params]
        self._bind_momentum()
        # a load builds new tensors: bind them at once, so what an exchange or finish() mixes is the loaded state
        register = getattr(wrapped, "register_load_state_dict_post_hook", None)  # torch >= 2.2 (else: at the step)
        if register is not None:
            self.load_hook = register(lambda optimizer: self._bind_momentum())
        return self.momentum

    @torch.no_grad()
    def _bind_momentum(self) -> None:
        """The optimizer's momentum buffers are ours (the protocol's flat state mixes ours): a buffer it
        holds that is not (its state loaded: ``load_state_dict`` builds new tensors) is copied into ours;
        none at all (a loaded state without momentum, or before the first step) is a zero momentum. Run
        after every load of the optimizer (a hook) and before every outer step."""
        for p, buffer in zip(self.params, self.momentum):
            state = self.optimizer.state[p]
            held = state.get("momentum_buffer")
            if held is not buffer:
                if held is None:
                    buffer.zero_()
                else:
                    buffer.copy_(held)
                state["momentum_buffer"] = buffer

    @torch.no_grad()
    def capture(self) -> None:
        """Take the model as it is now as the anchor (an exchange's average, the first step, loaded weights)."""
        for anchor, p in zip(self.anchor, self.params):
            anchor.copy_(p)
        self.pending_capture = False

    @torch.no_grad()
    def step(self) -> None:
        """Before an exchange: replace the model's parameters by the anchor stepped with this worker's
        pseudo-gradient ``anchor - model``."""
        self._bind_momentum()
        saved = [p.grad for p in self.params]
        for p, anchor in zip(self.params, self.anchor):
            p.grad = anchor - p  # this worker's pseudo-gradient
            p.copy_(anchor)
        with torch.enable_grad():
            self.optimizer.step()
        for p, grad in zip(self.params, saved):
            p.grad = grad
        self.steps += 1

    @torch.no_grad()
    def apply(self) -> None:
        """After an exchange that averaged the anchors with the models (Prague, AD-PSGD: see the module
        docstring): the model holds the average, the anchor the anchors' average; replace the parameters
        by that anchor stepped with ``anchor - model``, the group's averaged pseudo-gradient."""
        self._bind_momentum()
        saved = [p.grad for p in self.params]
        for p, anchor in zip(self.params, self.anchor):
            p.grad = anchor - p
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
        self._bind_momentum()
        self.steps = int(state.get("steps", 0))
