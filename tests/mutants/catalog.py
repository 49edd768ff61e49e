"""Mutants: deliberately broken variants of hetrain, to prove that the tests can fail (tests only: none of
this ships in the package, and hetrain itself never reads $HETRAIN_MUTANT).

A test that passes whether or not the workers communicate proves nothing about communication. With
``HETRAIN_MUTANT=NAME`` and ``tests/mutants/site`` on ``PYTHONPATH`` (the mutant meta-test,
``tests/mutants/test_mutants.py``, sets both; ``tests/conftest.py`` adds the path when the variable is set
by hand), every Python process of the run applies mutant NAME as its interpreter starts
(``tests/mutants/site/sitecustomize.py``): the test process, local workers and the warm server they fork
from, the ``hetrain`` command run as a subprocess, torchrun's ranks and Ray's actors.

``no-comm``, for one: the messages still flow (so nothing waits forever), but no worker's model ever
takes anything from them. Each worker's model changes only by its own optimizer steps:

- the constructor, ``step()``, ``should_stop()`` and ``finish()`` of every protocol class put the
  worker's own model back after they ran (the initial broadcasts of DDP and the parameter server,
  Hop's and D-PSGD's mixing, Prague's and AD-PSGD's group averages and their background ones, the
  parameter server's answer, the final average);
- DDP's gradient hook returns the worker's own gradients, unreduced.

``tests/mutants/test_mutants.py`` (slow set) runs the tests named for each mutant under it and expects each
to fail on one of its assertions.
"""

from __future__ import annotations

import functools
import os

import torch

from hetrain.errors import UsageError

ENV = "HETRAIN_MUTANT"


_applied: list[str] = []  # this process's (sitecustomize and the test process's conftest both ask)


def apply_from_env() -> None:
    """Apply the mutant ``$HETRAIN_MUTANT`` names, if any, once per process."""
    name = os.environ.get(ENV)
    if not name or name in _applied:
        return
    if name not in MUTANTS:
        raise UsageError(f"{ENV}={name!r} is no mutant; known: {', '.join(sorted(MUTANTS))}")
    _applied.append(name)
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
    timer.buckets += 1  # DDP's path ran (the forward went through it); only the communication is gone
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


# ----- one communication feature removed at a time (issue 36): each must make its tests fail ----------
# (``tests/mutants/test_mutants.py`` names the tests that must catch each; applied in the test process
# as well, by tests/conftest.py, for the tests that run in-process)

def outer_step_on_own_anchor() -> None:
    """The rule before issue 36: no step before the exchange; after it, each worker steps its own anchor
    with ``anchor - average`` (which holds the workers' disagreement off the complete graph)."""
    from hetrain.runtime.outer_step import OuterStep

    capture = OuterStep.capture
    # after the exchange, the own anchor stepped with anchor - average (apply, without averaged anchors)
    OuterStep.capture = lambda self: capture(self) if self.pending_capture else self.apply()
    OuterStep.step = lambda self: None


def anchor_at_build() -> None:
    """The anchor stays the model at construction: loaded weights become a pseudo-gradient."""
    from hetrain.runtime.protocol import SyncProtocol

    SyncProtocol._before_optimizer_step = lambda self, *args: None
    SyncProtocol._after_weights_loaded = lambda self, *args: None


def _patch_steps_weights(function) -> None:
    from hetrain.comm import local_work
    from hetrain.runtime import hop

    local_work.weights_by_steps = hop.weights_by_steps = function


def rows_by_steps() -> None:
    """Hop's rows rescaled by the steps behind each model and renormalized (the rule before issue 36)."""
    def rescaled(weights, steps, most_steps):
        own = (1.0 - sum(weights)) * most_steps
        scaled = [w * s for w, s in zip(weights, steps)]
        total = own + sum(scaled)
        return own / total, [w / total for w in scaled]

    _patch_steps_weights(rescaled)


def no_steps_weighting() -> None:
    """Hop's mixing ignores the local steps behind each model."""
    _patch_steps_weights(lambda weights, steps, most_steps: (1.0 - sum(weights), list(weights)))


def no_circulation_weighting() -> None:
    """Hop's and D-PSGD's mixing on a directed graph ignores the local steps (the graph's own weights)."""
    from hetrain.comm import local_work
    from hetrain.runtime import hop

    local_work.weights_by_circulation = hop.weights_by_circulation = \
        lambda weights, own_steps, slowest_steps: (1.0 - sum(weights), list(weights))


def circulation_by_own_steps() -> None:
    """The directed graph's rows scaled with this worker's own steps as the slowest (each worker's own view)."""
    from hetrain.runtime.protocol import SyncProtocol

    SyncProtocol._slowest_steps = lambda self: self.steps_this_exchange if self._speeds is not None else None


def preduce_unweighted() -> None:
    """Prague's and AD-PSGD's P-Reduce ignores the local steps (``weight=None``)."""
    from hetrain.runtime.prague import GroupProtocol

    reduce = GroupProtocol._reduce
    GroupProtocol._reduce = lambda self, flat, groups, weight=None: reduce(self, flat, groups, None)


def ps_final_from_server() -> None:
    """The parameter server's final model is the server's copy, without the worker's last push."""
    from hetrain.runtime import parameter_server

    finish = parameter_server.ParameterServer._finish

    def without_last_push(self):
        self._local_steps, outer = 0, self._outer
        self._outer = None
        try:
            finish(self)
        finally:
            self._outer = outer

    parameter_server.ParameterServer._finish = without_last_push


def outer_step_without_exchange() -> None:
    """A group protocol's sync that formed no group still takes an outer step."""
    from hetrain.runtime.prague import GroupProtocol

    GroupProtocol._averaged = lambda self: True


def fingerprint_without_comm() -> None:
    """The resume fingerprint ignores the communication settings."""
    from hetrain.jobs import checkpoint

    checkpoint.comm_fingerprint = lambda comm: {}


def free_collectives() -> None:
    """The emulated link counts a collective's bytes but holds nobody for them."""
    from hetrain.transport.link import EmulatedLink

    def counted_only(self, members, sent_bytes, received_bytes, steps):
        with self._lock:
            self.bytes_sent += int(sent_bytes)
            self.bytes_received += int(received_bytes)

    EmulatedLink.collective = counted_only


def topk_random_indices() -> None:
    """Top-k sends k values at random positions instead of the largest."""
    from hetrain.compression import codecs

    def encode(self, x):
        x = x.reshape(-1).to(torch.float32)
        index, _ = torch.sort(torch.randperm(x.numel(), generator=torch.Generator().manual_seed(0))[: self.k])
        return codecs._as_bytes(index.to(torch.int32), x[index])

    codecs.TopK.encode = encode


def decoders_scaled() -> None:
    """Every lossy codec's decoder returns a hundredth of what was sent."""
    from hetrain.compression import codecs

    for cls in (codecs.BFloat16, codecs.Int8, codecs.Int4, codecs.TopK, codecs.PowerSGD):
        decode = cls.decode
        cls.decode = lambda self, payload, decode=decode: decode(self, payload) * 0.01


def int4_one_value_per_byte() -> None:
    """Int4's decoder reads only the low half of each byte (every odd value comes back as the even one)."""
    from hetrain.compression import codecs

    def decode(self, payload):
        blocks = -(-self.numel // codecs.INT8_BLOCK)
        low = payload[4 * blocks:] & 0x0F
        q = torch.stack([low, low], dim=1).reshape(-1)[: self.numel].to(torch.float32) - 8.0
        return codecs._dequantize_blocks(payload[: 4 * blocks].view(torch.float32), q, self.numel)

    codecs.Int4.decode = decode


def admitted_before_start() -> None:
    """The launcher admits a ready replacement while originals are still building their protocols."""
    from hetrain.jobs import start_gate

    start_gate.admits_replacements = lambda go: True


def ready_only_at_the_barrier() -> None:
    """A protocol's first step does not mark its worker ready (only ``ctx.start_barrier()`` does)."""
    from hetrain.jobs.context import LauncherMembership

    LauncherMembership.note_ready = lambda self: None


def data_split_ignored() -> None:
    """``--data-split whole`` samples each worker's shard all the same."""
    from hetrain import data

    make = data.make_sampler
    data.make_sampler = lambda *args, split="shard", **kwargs: make(*args, **kwargs)


def balance_ignored() -> None:
    """``--data-split balanced`` never hears the rates: every worker keeps to its own shard."""
    from hetrain.shard_balance import BalancedSampler

    BalancedSampler.set_rates = lambda self, rates: None


def no_dead_band() -> None:
    """The balanced split moves batches at any difference in speed, however small (jitter, lockstep)."""
    from hetrain import shard_balance

    mix = shard_balance.shard_mix
    shard_balance.shard_mix = lambda rates, rank, dead_band=0.0: mix(rates, rank, 0.0)


def momentum_unmixed() -> None:
    """Hop and D-PSGD keep each worker's outer momentum its own (the models alone are mixed)."""
    from hetrain.runtime.hop import Hop

    Hop.outer_mixes_momentum = False


def momentum_unbound_after_load() -> None:
    """A loaded outer optimizer's new momentum tensors stay apart from the buffers the protocol mixes."""
    from hetrain.runtime.outer_step import OuterStep

    def bind_where_empty(self) -> None:
        for p, buffer in zip(self.params, self.momentum):
            self.optimizer.state[p].setdefault("momentum_buffer", buffer)

    OuterStep._bind_momentum = bind_where_empty


def momentum_bound_only_at_the_step() -> None:
    """No hook on the outer optimizer's load: a loaded momentum reaches the mixed buffers only at the next
    outer step (an exchange or finish() before it mixes the old buffers)."""
    from hetrain.runtime.outer_step import OuterStep

    original = OuterStep.mix_momentum

    def mix_without_the_hook(self):
        buffers = original(self)
        if self.load_hook is not None:
            self.load_hook.remove()
            self.load_hook = None
        return buffers

    OuterStep.mix_momentum = mix_without_the_hook


def sign_scaled_by_the_largest() -> None:
    """The momentum's one-bit code scales each block by its largest magnitude, not its mean."""
    import math

    import torch

    from hetrain.compression import codecs

    def encode(self, x):
        x = x.reshape(-1).to(torch.float32)
        padded = torch.nn.functional.pad(x, (0, self.blocks * codecs.INT8_BLOCK - self.numel))
        scale = padded.view(self.blocks, codecs.INT8_BLOCK).abs().amax(dim=1)
        bits = (padded[: 8 * math.ceil(self.numel / 8)] >= 0).to(torch.uint8).view(-1, 8)
        return codecs._as_bytes(scale, (bits << torch.arange(8, dtype=torch.uint8)).sum(1, dtype=torch.uint8))

    codecs.ScaledSign.encode = encode


def sign_bits_reversed() -> None:
    """The one-bit code's packing puts flag k in bit 7 - k, where the decoder reads bit k."""
    from hetrain.compression import codecs

    encode = codecs.ScaledSign.encode

    def reversed_bits(self, x):
        payload = encode(self, x)
        head, packed = payload[: 4 * self.blocks], payload[4 * self.blocks:]
        flipped = sum((((packed >> k) & 1) << (7 - k)) for k in range(8)).to(torch.uint8)
        return torch.cat([head, flipped])

    codecs.ScaledSign.encode = reversed_bits


def topk_sample_trusted() -> None:
    """Top-k trusts its sample's threshold: when too few values pass, it pads with the first indices
    instead of searching the whole vector."""
    from hetrain.compression import codecs

    def largest(magnitude, k, sample_size=65536):
        stride = max(1, magnitude.numel() // sample_size)
        sample = magnitude[::stride]
        rank = min(sample.numel(), -(-3 * k * sample.numel() // (2 * magnitude.numel())) + 16)
        threshold = torch.topk(sample, rank, sorted=False).values.min()
        candidates = torch.nonzero(magnitude >= threshold).squeeze(1)
        if candidates.numel() < k:
            spare = torch.ones(magnitude.numel(), dtype=torch.bool)
            spare[candidates] = False
            return torch.cat([candidates, torch.nonzero(spare).squeeze(1)[: k - candidates.numel()]])
        return candidates[torch.topk(magnitude[candidates], k, sorted=False).indices]

    codecs._largest_magnitudes = largest


def compressed_preduce_unweighted() -> None:
    """A compressed P-Reduce moves every member toward the plain mean of the copies, whatever steps each
    sent (``local_work="auto"``'s weights dropped)."""
    from hetrain.compression import preduce_compressed
    from hetrain.groups import preduce

    exchange = preduce_compressed.compressed_exchange

    def unweighted(comm, buf, index, size, codec, replicas, gamma, weight, wait):
        return exchange(comm, buf, index, size, codec, replicas, gamma, None, wait)

    preduce_compressed.compressed_exchange = unweighted
    preduce.compressed_exchange = unweighted  # the P-Reduce's own name for it


def quantized_in_the_input() -> None:
    """The quantizers divide and round the caller's tensor itself when it is whole blocks long."""
    import math

    from hetrain.compression import codecs

    quantize = codecs._quantize_blocks

    def in_place(x, numel, levels):
        flat = x.reshape(-1)
        blocks = math.ceil(numel / codecs.INT8_BLOCK)
        if flat.dtype != torch.float32 or blocks * codecs.INT8_BLOCK != numel:
            return quantize(x, numel, levels)
        padded = flat.view(blocks, codecs.INT8_BLOCK)
        scale = padded.abs().amax(dim=1) / float(levels)
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        return scale, padded.div_(scale[:, None]).round_().clamp_(-levels, levels).reshape(-1)

    codecs._quantize_blocks = in_place


def topk_ties_as_topk_likes() -> None:
    """Top-k picks among the candidates with ``torch.topk`` alone: ties at the k-th magnitude go
    wherever it puts them, not to the lowest indices."""
    from hetrain.compression import codecs

    largest = codecs._largest_magnitudes

    def as_topk_likes(magnitude, k, sample_size=65536):
        chosen = largest(magnitude, k, sample_size)
        pool = torch.nonzero(torch.logical_not(magnitude < magnitude[chosen].min())).squeeze(1)
        return pool[torch.topk(magnitude[pool], k, sorted=False).indices]

    codecs._largest_magnitudes = as_topk_likes


def topk_nan_below_threshold() -> None:
    """Top-k's candidates are the values at or above the sample's threshold, so a NaN the sample
    missed is never sent (its receivers' copies hide it)."""
    from hetrain.compression import codecs

    largest = codecs._largest_magnitudes

    def nan_dropped(magnitude, k, sample_size=65536):
        return largest(torch.nan_to_num(magnitude, nan=0.0), k, sample_size)

    codecs._largest_magnitudes = nan_dropped


def sparse_topk_zeros_from_the_end() -> None:
    """A vector mostly of zeros with fewer values above zero than k tops its choice up with the zeros of
    highest index, not lowest (the tie rule broken on the sparse path alone)."""
    from hetrain.compression import codecs

    def from_the_end(magnitude, k):
        nonzero = torch.nonzero(torch.logical_not(magnitude <= 0)).squeeze(1)
        if nonzero.numel() >= k:
            return nonzero[codecs._largest_magnitudes(magnitude[nonzero], k)]
        zeros = torch.nonzero(magnitude == 0).squeeze(1)[nonzero.numel() - k:]
        return torch.cat([nonzero, zeros])

    codecs._largest_of_sparse = from_the_end


def sparse_topk_first_k() -> None:
    """A vector mostly of zeros with more values above zero than k sends the first k of them by index,
    not the k largest (the sparse path's choice skipped)."""
    from hetrain.compression import codecs

    sparse = codecs._largest_of_sparse

    def first_k(magnitude, k):
        nonzero = torch.nonzero(torch.logical_not(magnitude <= 0)).squeeze(1)
        return nonzero[:k] if nonzero.numel() >= k else sparse(magnitude, k)

    codecs._largest_of_sparse = first_k


def late_stop_unreported() -> None:
    """A stop that comes after the workers ended is held as before, but the record run_training returns
    does not say it came (a library caller running several jobs goes on)."""
    from hetrain.jobs import interrupts

    class Unreported(interrupts.HeldAfterTheJob):
        def _on_signal(self, signum, frame) -> None:
            super()._on_signal(signum, frame)
            self.received = None

    interrupts.held_after_the_job = Unreported


def bit_packing_on_any_byte_order() -> None:
    """int4 and the one-bit code are made on a big-endian machine too (where they would swap values)."""
    from hetrain.compression import codecs

    codecs._require_little_endian = lambda code: None


def warm_server_started_unblocked() -> None:
    """The warm server starts with SIGTERM open, as before 2026-12-07: a group SIGTERM in its interpreter's
    start-up (before its preload ignores the signal) ends it."""
    from hetrain.jobs import warm_start

    warm_start._block_sigterm = lambda: None


def attempt_store_unprefixed() -> None:
    """Under torchrun's agent store every attempt shares one key space (no attempt prefix)."""
    from hetrain.transport import job

    job._attempt_store = lambda timeout: None


def momentum_in_the_model_s_code() -> None:
    """The outer momentum beside a compressed model goes in the model's code, not one bit a value."""
    from hetrain.runtime import hop

    make = hop.make_codec
    hop.make_codec = lambda spec, numel, shapes=None, head=None: make(spec, numel, shapes)


def anchors_in_the_model_s_code() -> None:
    """Prague's and AD-PSGD's anchors beside a compressed model go in the model's code (the rule before)."""
    from hetrain.runtime import prague

    make = prague.make_codec
    prague.make_codec = lambda spec, numel, shapes=None, head=None: make(spec, numel, shapes)


def rates_from_a_few_batches() -> None:
    """The rate board reads a rate from any count, however coarse (one batch more reads as twice the speed)."""
    from hetrain.jobs.rate_board import RateBoard

    init = RateBoard.__init__

    def coarse(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.min_batches = 1

    RateBoard.__init__ = coarse


def stale_replicas_across_edges() -> None:
    """Hop keeps counting a receiver as holding its public copy through a gap in their edge: neither the
    sender's forgetting of changed edges nor the public copy's dropping of a holder a delta skipped."""
    from hetrain.compression.gossip_codec import PublicCopy
    from hetrain.runtime.hop import Hop

    Hop._forget_changed_edges = lambda self, out_neighbors: None
    prepare = PublicCopy.prepare

    def prepare_keeping_skipped_holders(self, model, dsts):
        holders = set(self.synced)
        sent = prepare(self, model, dsts)
        self.synced |= holders
        return sent

    PublicCopy.prepare = prepare_keeping_skipped_holders


def ingress_in_arrival_order() -> None:
    """The receiver books its ingress in the order its threads finish receiving (the rule before the review)."""
    from hetrain.transport import link
    from hetrain.transport.link_spec import book_ingress

    def sequential(busy, first_bit, last_bit, transfer_s):
        free = busy[-1][1] if busy else 0.0
        arrival, _ = book_ingress(free, first_bit, last_bit, transfer_s)
        busy.append([max(free, first_bit), arrival])
        return arrival

    link.book_ingress_any_order = sequential


def free_gg_requests() -> None:
    """The Group Generator's requests and answers pay no emulated link."""
    from hetrain.transport.link import EmulatedLink

    EmulatedLink.round_trip = lambda self, peer, sent_bytes, received_bytes: None


def no_shared_start() -> None:
    """Hop's first message on every edge is a keyframe, even where both ends start from one model."""
    from hetrain.runtime.hop import Hop

    Hop._seed_shared_start = lambda self, skipped: None


def anchors_kept_local() -> None:
    """Prague's and AD-PSGD's anchors are not averaged with the models (each steps its own anchor with
    ``anchor - average``: the rule before issue 36)."""
    from hetrain.runtime import flat_state

    init = flat_state.FlatState.__init__
    flat_state.FlatState.__init__ = lambda self, module, extra=(): init(self, module)


def plan_shards_frozen() -> None:
    """Training with a plan: the optimizer gets zero gradients, so no shard ever changes."""
    from hetrain.planner.train_step import TrainStep

    gradients = TrainStep.gradients
    TrainStep.gradients = lambda self, grads: [g.zero_() for g in gradients(self, grads)]


def plan_update_unlike_the_whole_model() -> None:
    """Training with a plan: every rank's optimizer takes Nesterov steps where the whole model takes plain
    momentum ones (the loss and gradients of each step still equal the whole model's)."""
    from hetrain.planner import train_check, train_worker

    def nesterov(torch, params, lr, momentum):
        return torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=True)

    train_check.make_optimizer = train_worker.make_optimizer = nesterov


def plan_replicas_disagree() -> None:
    """Training with a plan: odd ranks' float32 steps scale their gradients by 1.01, so the copies of a
    replicated weight part ways between the float64 windows (which start from the copies' average)."""
    from hetrain.planner.train_step import TrainStep

    gradients = TrainStep.gradients

    def scaled(self, grads):
        got = gradients(self, grads)
        if self.me % 2 and self.dtype == self.torch.float32:
            return [g * 1.01 for g in got]
        return got

    TrainStep.gradients = scaled


def plan_verdict_ignores_replicas() -> None:
    """Training with a plan: the verdict leaves out the copies' disagreement (the verdict before issue 68)."""
    from hetrain.planner import train

    train.TrainReport.checks_ok = property(lambda self: max(
        self.max_loss_diff_vs_unpartitioned, self.max_grad_diff_vs_unpartitioned, self.max_module_loss_diff,
        self.max_update_diff_vs_whole_model, self.max_trajectory_grad_diff) <= train.CHECK_TOLERANCE
        and bool(self.trajectory))


def plan_bias_on_every_rank() -> None:
    """Training with a plan: every rank holding a layer's bias adds it to its partial outputs, even where
    another rank's box of the same outputs starts at input feature 0 (the bias is summed twice)."""
    from hetrain.planner.train_step import TrainStep

    def holders_everywhere(init):
        def wrapper(self, program, rank, torch, dist, dtype, weights, biases):
            init(self, program, rank, torch, dist, dtype, weights, biases)
            for i, b in enumerate(biases):
                if b is not None and i not in self.biases:
                    i0, i1, o0, o1 = program.weight_box(i, rank)
                    self.biases[i] = b[o0:o1].to(dtype).clone()
                    self.bias_boxes[i][rank] = (0, 1, o0, o1)
        return wrapper

    TrainStep.__init__ = holders_everywhere(TrainStep.__init__)
    TrainStep._add_bias = lambda self, i, need, partial: (
        partial if i not in self.biases or not partial.numel()
        else partial + self.biases[i].reshape(1, -1, *([1] * (partial.dim() - 2))))


def plan_flat_reductions() -> None:
    """Training with a plan: sums over replicated boxes send every contribution to every holder (one
    round per level), as before issue 42, instead of reducing up the hierarchy."""
    from hetrain.planner import boxes, program

    def flat(layout, held):
        transfers = boxes.reduce_plan(layout, held, held)
        return [("add", [t for t in transfers if t.level == k]) for k in sorted({t.level for t in transfers})]

    boxes.allreduce_rounds = program.allreduce_rounds = flat


def link_ingress_own_rule() -> None:
    """The runtime's emulated link frees a receiver's ingress at its own transfer's end (the rule before the
    one link clock), not when a slow sender's last bit has come."""
    from hetrain.transport import link

    def arrive(self, nbytes, src, stamps):
        first_bit_us, sent_us = (int(v) for v in stamps)
        with self._lock:
            self.bytes_received += nbytes
            if self.spec is None or (first_bit_us, sent_us) == link.NO_STAMPS:
                return
            start = max(first_bit_us / 1e6, self._ingress_free)
            transfer = self.spec.transfer_s(self.rank, nbytes)
            self._ingress_free = start + transfer
            self.ingress_s += transfer
        self._hold_until(max(sent_us / 1e6, start + transfer))

    link.EmulatedLink.arrive = arrive


def server_not_last() -> None:
    """Workers wait for the parameter server's arrival by its steps alone (it takes none while serving)."""
    from hetrain.runtime.progress import ProgressBeacon

    original = ProgressBeacon.wait_for_arrivals
    ProgressBeacon.wait_for_arrivals = lambda self, dead_workers, what, last=None: original(self, dead_workers, what)


def iteration_from_logic() -> None:
    """Hop's metrics report its logic's count of exchanges as the iteration counter (H times smaller)."""
    from hetrain.runtime.hop import Hop

    original = Hop.metrics

    def metrics(self):
        self.stats.iteration = self.logic.iteration
        return original(self)

    Hop.metrics = metrics


def finished_neighbours_sent_to() -> None:
    """Hop keeps sending to a neighbour a repair gave it after that neighbour finished (the rule before
    this was found: such a send waits in gloo's connect until the timeout)."""
    from hetrain.runtime.hop import Hop

    def counted_as_stopped_only(self):
        senders, token_sources = self.membership.finished_without_stop()
        for peer in senders & set(self.logic.in_weights):
            self.logic.sender_finished(peer)
        for peer in token_sources & set(self.logic.tokens):
            self.logic.token_source_finished(peer)

    Hop._note_finished_neighbours = counted_as_stopped_only


def interim_edges_ignored() -> None:
    """Hop listens only on its own graph's edges when a death and its replacement are seen in one look
    (the rule before this was found: a neighbour that saw the death alone sent over an edge nobody used,
    and waited in gloo's connect for ever)."""
    from hetrain.runtime.hop import Hop

    Hop._listen_on_interim_edges = lambda self, unseen: None


def idle_edges_bounded() -> None:
    """Peer channels bound every header wait by gloo's timeout, also where deaths are tolerated (the rule
    before this was found: a receiver left on an edge a repair made and a join unmade timed out, and the
    timeout closed every pair of its group)."""
    from hetrain.transport.peer_channels import PeerChannels

    original = PeerChannels.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self._header_timeout = self._receive_timeout

    PeerChannels.__init__ = init


def unsettled_replacements_kept() -> None:
    """The launcher, closing the membership, stops only the replacements not yet admitted (the rule before
    this was found: one admitted as its neighbours finished waited for a model that never came, and
    they for it in the final average, until the timeout)."""
    from hetrain.jobs.deaths import Replacements

    original = Replacements.join

    def join(self, rank, incarnation, training_time_s):
        joined = original(self, rank, incarnation, training_time_s)
        self.unsettled.pop(rank, None)  # never counted as holding no model: the close leaves it alone
        return joined

    Replacements.join = join


def freeze_after_the_wait() -> None:
    """The final average waits for every member to arrive before it closes the membership (the order
    before this was found: nobody closed it while an admitted replacement that would never arrive was
    waited for)."""
    import sys

    from hetrain.runtime import consensus, prague

    original = consensus.freeze_membership

    def freeze_in_the_collective_only(job, dead_workers, what):
        if sys._getframe(1).f_code.co_name != "over_survivors":
            return consensus.Membership.of(dead_workers)
        return original(job, dead_workers, what)

    consensus.freeze_membership = prague.freeze_membership = freeze_in_the_collective_only


def first_sends_unwatched() -> None:
    """The first message to a peer's new process is posted on the main thread (the rule before this was
    found: a replacement dead before it connected held its neighbours there until gloo's timeout)."""
    from hetrain.transport.peer_channels import PeerChannels

    PeerChannels._start_first = lambda self, dst, start: start


def replacements_admitted_together() -> None:
    """The launcher admits every replacement as soon as it is ready (the rule before this was found: two
    neighbours admitted together each waited for the other's model, which neither had)."""
    from hetrain.jobs.deaths import Replacements

    Replacements.admitting = lambda self: False


def late_updates_as_models() -> None:
    """Old (stale, late) updates averaged as the old models they are, with ``late_updates="progress"`` asked
    for (Hop's own rule: every one pulls its worker back by the steps taken since)."""
    from hetrain.protocols.lag_compensation import OwnProgress

    OwnProgress.lost_steps = lambda self, term: None


def progress_with_the_mixing() -> None:
    """P measured from the last send instead of the last mix, so it holds the mixing's moves too: the
    first rule, ``weight * (x_j,k' - x_i,k')``, which diverged in the simulator."""
    from hetrain.protocols.lag_compensation import OwnProgress

    sent = OwnProgress.sent

    def sent_from_the_last_send(self, iteration, model, empty=None):
        sent(self, iteration, model, empty)
        self._mixed = model

    OwnProgress.sent = sent_from_the_last_send
    OwnProgress.mixed = lambda self, model: None


def loaded_weights_as_progress() -> None:
    """Weights loaded into a Hop model (``model.load_state_dict``, or changed and ``sync.reanchor()``)
    counted as the worker's own progress under ``late_updates="progress"``."""
    from hetrain.runtime.hop import Hop

    Hop._weights_replaced = lambda self: None


def reanchor_outer_only() -> None:
    """``sync.reanchor()`` re-anchors the outer optimizer only (Hop's progress still counts the change)."""
    from hetrain.runtime.protocol import SyncProtocol

    def reanchor(self):
        if self._outer is not None:
            self._outer.capture()

    SyncProtocol.reanchor = reanchor


def powersgd_cold_resume() -> None:
    """All-Reduce's PowerSGD state is not in its checkpoint (a resume starts PowerSGD cold)."""
    from hetrain.runtime.allreduce import AllReduce

    AllReduce._extra_state = lambda self: {}


def own_state_from_rank_0() -> None:
    """The replicas that load rank 0's protocol state take its own part too (rank 0's error feedback)."""
    from hetrain.jobs import train_worker

    def restore(state, model, optimizer, sampler, protocol):
        if protocol._steps_together and protocol.job.world_size > 1:
            shared = [{name: state[name] for name in ("model", "optimizer", "protocol")}]
            torch.distributed.broadcast_object_list(shared, src=0, group=protocol.job.group)
            state = {**state, **shared[0]}
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        sampler.load_state_dict(state["sampler"])
        protocol.load_state_dict(state["protocol"])

    train_worker._restore = restore


def resume_with_nothing_left() -> None:
    """A resume whose every worker is past ``--iterations`` is accepted (it trained nothing, exit 0)."""
    from hetrain.jobs import checkpoint

    checkpoint.iterations_left = lambda path, config, reached: None


def restart_after_the_end_refused() -> None:
    """A torchrun restart after a death past the last checkpoint is taken for a user's resume of a finished
    run: refused (nothing left to train), and torchrun's job fails with no record."""
    from hetrain.jobs import torchrun_restart

    torchrun_restart.restarts_this_job = lambda directory: False


def any_torchrun_attempt_finishes() -> None:
    """Every torchrun attempt reads as a restart of the job that trained in the directory: a new torchrun
    command resuming a finished run trains nothing and exits 0, silently."""
    import os

    from hetrain.jobs import torchrun_restart

    torchrun_restart.restarts_this_job = lambda directory: torchrun_restart.RUN_ID_ENV in os.environ


def deaths_on_the_raw_clock() -> None:
    """A death's ``wall_s`` is the launcher's raw ``time.monotonic()`` (seconds since the machine booted)."""
    import time

    from hetrain.jobs.deaths import DeathRecords

    died = DeathRecords.died

    def raw(self, *args, **kwargs):
        died(self, *args, **kwargs)
        self.records[-1]["wall_s"] = time.monotonic()

    DeathRecords.died = raw


def topology_by_its_path() -> None:
    """The resume fingerprint reads no edge file's content (as when it held the path): a file edited between a run
    and its resume is accepted."""
    from hetrain.jobs import checkpoint

    checkpoint.edges_digest = lambda edges: "edges"


def refusal_as_a_dump() -> None:
    """A resume's refusal shows both fingerprints whole (the dump of dicts it printed), not the flag's values."""
    from hetrain.jobs import checkpoint

    first = checkpoint._first_difference

    def dump(saved, expected):
        found = first(saved, expected)
        return None if found is None else (found[0], saved, expected)

    checkpoint._first_difference = dump


def rewound_epoch_claimed_again() -> None:
    """A pass over a rewound epoch claims from the counter its first pass emptied: it yields no batch."""
    from hetrain.integrations import shared_batches

    shared_batches.claims_key = lambda epoch, earlier_passes: f"epoch/{epoch}"


def mid_fit_load_deferred() -> None:
    """A checkpoint HetrainStrategy loads during a fit keeps the protocol's state for a setup already past."""
    from lightning.pytorch.strategies import DDPStrategy

    from hetrain.integrations.lightning import HetrainStrategy

    def load_checkpoint(self, checkpoint_path, *args, **kwargs):
        checkpoint = DDPStrategy.load_checkpoint(self, checkpoint_path, *args, **kwargs)
        self._resumed = checkpoint.get("hetrain")
        return checkpoint

    HetrainStrategy.load_checkpoint = load_checkpoint


def replaced_edge_kept() -> None:
    """A death and its replacement seen in one look keep the edge as it was (the dead process's queued
    updates and spent tokens carried over to its replacement)."""
    from hetrain.protocols.hop_logic import HopWorker

    HopWorker.replace_neighbour = lambda self, peer: None


def one_queue_for_all() -> None:
    """Every worker process writes to the same two queues (their writers share one lock)."""
    from hetrain.jobs import mailboxes

    shared = {}

    def the_same_queues(context):
        if "pair" not in shared:
            shared["pair"] = (context.Queue(), context.Queue())
        return shared["pair"]

    mailboxes.own_queues = the_same_queues


def results_whole_through_the_pipe() -> None:
    """A worker's result goes down its queue's pipe whole, megabytes in pieces (the rule before the file)."""
    from hetrain.jobs import mailboxes

    mailboxes.post_result = lambda results, message, directory, name: results.put(message)


def workers_die_on_sigterm() -> None:
    """A worker dies of a SIGTERM sent to every process of the job (the rule before the launcher stopped
    them on SIGTERM as on Ctrl-C). Applied as each interpreter starts, it takes effect in a worker once the
    worker has set its own dispositions: as it starts its heartbeat, just after."""
    import signal

    from hetrain.jobs import worker_process

    start_heartbeat = worker_process.start_heartbeat

    def dying_on_sigterm(*args, **kwargs):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        return start_heartbeat(*args, **kwargs)

    worker_process.start_heartbeat = dying_on_sigterm


def outer_defaults_diloco_always() -> None:
    """The outer lr and momentum not given are DiLoCo's whatever the optimizer inside (the rule before)."""
    from hetrain.comm import settings

    settings.outer_defaults = lambda inner: (settings.DILOCO_OUTER_LR, settings.DILOCO_OUTER_MOMENTUM)


def orphaned_job_dirs_kept() -> None:
    """No job removes the folders SIGKILLed launchers left (the rule before)."""
    from hetrain.jobs import job_dirs

    job_dirs.sweep_orphaned_job_dirs = lambda parent=None: []


def long_tempdir_forkserver() -> None:
    """The warm server's socket is made whatever the temp dir's length (the rule before: a traceback)."""
    from hetrain.jobs import warm_start

    warm_start._tempdir_fits_a_socket = lambda: True


def resumed_from_own_iteration() -> None:
    """Prague's static schedule goes on from each worker's own file's iteration, not the lowest (the rule before)."""
    from hetrain.runtime.prague import Prague

    Prague._load_extra_state = lambda self, state: None


def hop_resumed_from_own_iteration() -> None:
    """Hop's workers go on from each one's own file's exchange, not the lowest (the rule before)."""
    from hetrain.runtime.hop import Hop

    Hop._align_resumed_iteration = lambda self: None


def arrivals_not_progress() -> None:
    """A worker waiting at the end counts only steps as progress, not the others' arrivals (the rule before)."""
    from hetrain.runtime.progress import ProgressBeacon

    ProgressBeacon._someone_arrived = staticmethod(lambda missing, before: False)


def arrivals_progress_forever() -> None:
    """A worker waiting at the end counts every look as an arrival: it never gives up on the stuck."""
    from hetrain.runtime.progress import ProgressBeacon

    ProgressBeacon._someone_arrived = staticmethod(lambda missing, before: True)


def every_worker_scores_the_final_model() -> None:
    """Every worker evaluates the final model, not only the first live one (the rule before)."""
    from hetrain.jobs import train_worker

    train_worker._first_live_rank = lambda ctx: ctx.rank


def record_unheld() -> None:
    """A stop signal after the workers ended finds the launcher unprotected (the gap before the hold)."""
    from hetrain.jobs import interrupts

    interrupts.HeldAfterTheJob.__enter__ = lambda self: self
    interrupts.HeldAfterTheJob.__exit__ = lambda self, *exc: None


def comparison_goes_on_after_a_stop() -> None:
    """A comparison runs its next protocol after a stop that came as the last record was written."""
    from hetrain.jobs import interrupts

    interrupts.stop_received = lambda: None


def hop_update_to_first_out_neighbour_only() -> None:
    """Hop sends each iteration's model to its first out-neighbour only (the fake transport's wiring test)."""
    from hetrain.runtime.hop import Hop

    send_update = Hop._send_update
    Hop._send_update = lambda self, dsts, iteration, model: send_update(self, list(dsts)[:1], iteration, model)


def hop_graph_not_repaired() -> None:
    """Hop keeps its graph after a death: the survivors never send over the edges a repair makes."""
    from hetrain.runtime import hop

    hop.repair = lambda topology, dead: topology


def ps_answers_the_first_worker() -> None:
    """The parameter server sends every answer to worker 1, whoever pushed (the fake transport's PS test)."""
    from hetrain.runtime.parameter_server import _Server

    answer = _Server._answer
    _Server._answer = lambda self, worker: answer(self, min(worker, 1) if worker else 0)


def keyframes_always() -> None:
    """Compressed gossip forgets which receivers hold its public copy: every message a keyframe, no delta."""
    from hetrain.compression.gossip_codec import PublicCopy

    prepare = PublicCopy.prepare

    def always(self, model, dsts):
        self.public, self.synced = None, set()
        return prepare(self, model, dsts)

    PublicCopy.prepare = always


def calibration_sticks() -> None:
    """The emulated sleep subtracts the first iteration's work from every target (the rule before: a
    calibration taken once, which stuck when the machine was busy at the start)."""
    from hetrain.jobs import emulation

    measured = emulation.ComputeEmulator.end

    def end(self, target_s, factor=1.0, excluded_s=0.0):
        if not hasattr(self, "_first_work_s"):
            self._first_work_s = max(0.0, self.clock() - self._began - excluded_s)
            return measured(self, target_s, factor, excluded_s)
        real_clock, began = self.clock, self._began
        work_s = max(0.0, real_clock() - began - excluded_s)
        shift = self._first_work_s - work_s  # the work counts as the first iteration's, whatever it took
        self.clock = lambda: real_clock() + shift
        try:
            return measured(self, target_s, factor, excluded_s)
        finally:
            self.clock = real_clock

    emulation.ComputeEmulator.end = end


def ddp_wait_as_work() -> None:
    """DDP's wait inside backward counts as the work the emulated sleep completes (a fast worker waiting
    for a straggler reads as math over its target)."""
    from hetrain.runtime.allreduce import AllReduce

    AllReduce._backward_wait_s = lambda self: 0.0


def standalone_ignores_achieved() -> None:
    """The emulated standalone iteration is the target alone, whatever compute phase the worker achieved."""
    from hetrain.jobs import capacity, train_worker

    computed = capacity.standalone_iteration_s

    def target_only(config, slowdown, rank, math_s, compute_s, iterations, achieved_s=None):
        return computed(config, slowdown, rank, math_s, compute_s, iterations)

    capacity.standalone_iteration_s = train_worker.standalone_iteration_s = target_only


def cli_reference_without_last_flag() -> None:
    """The site's command-line reference leaves out each command's last flag (a page drifted from the parser)."""
    from hetrain import cli_markdown

    full = cli_markdown.flag_rows
    cli_markdown.flag_rows = lambda parser: full(parser)[:-1]


def compare_writes_no_plot() -> None:
    """``hetrain compare`` leaves an empty ``over_time.png`` where the README promises a plot (figures are
    saved as zero bytes: matplotlib is patched, not hetrain.comparison, whose imports reach back here)."""
    from pathlib import Path

    from matplotlib.figure import Figure

    Figure.savefig = lambda self, fname, *args, **kwargs: Path(fname).write_bytes(b"")



def _cite_records():
    """scripts/cite_records.py as a module (loaded once: the test loads the same one)."""
    import importlib.util
    import sys
    from pathlib import Path

    if "cite_records" not in sys.modules:
        path = Path(__file__).resolve().parents[2] / "scripts" / "cite_records.py"
        spec = importlib.util.spec_from_file_location("cite_records", path)
        sys.modules["cite_records"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["cite_records"])
    return sys.modules["cite_records"]


def citations_left_as_they_were() -> None:
    """scripts/cite_records.py rewrites no citation of the split docs pages (the text stays as it was)."""
    module = _cite_records()
    module.rewrite = lambda text, rel, mapping: (text, [])


def part_titles_dropped() -> None:
    """scripts/cite_records.py drops the title of a cited part of a record (the reader loses the part)."""
    module = _cite_records()
    place = module.place

    def place_without_titles(*args):
        placed = place(*args)
        return None if placed is None else (placed[0], False)

    module.place = place_without_titles


def unplaced_citations_unreported() -> None:
    """scripts/cite_records.py leaves a citation it cannot place without a word."""
    module = _cite_records()
    rewrite = module.rewrite
    module.rewrite = lambda text, rel, mapping: (rewrite(text, rel, mapping)[0], [])


def record_citations_unseen() -> None:
    """scripts/cite_records.py finds no citation of a record or a result (so none can be missing)."""
    import re

    _cite_records().CITED = re.compile(r"(?!)")


def unauthenticated_peer_accepted() -> None:
    """hetrain's services take any peer: the check of the job's secret is skipped (the Group Generator's
    hello, the MAC of what a Ray job's channels read from the driver's store)."""
    from hetrain.transport import job_secret

    job_secret.same_secret = lambda given, secret: True
    job_secret.unseal = lambda secret, key, data: bytes(data).partition(b".")[2] if b"." in bytes(data) else None


def advise_ranks_first_candidate() -> None:
    """``hetrain advise`` ranks nothing: the candidates stay in the order they were listed (allreduce first)."""
    from hetrain.advisor import candidates

    candidates.rank = lambda predictions: list(predictions)


def advise_profile_from_flags() -> None:
    """``hetrain advise`` simulates the speeds the flags gave (--compute-ms, --slowdown), not the measured ones."""
    from hetrain.advisor import candidates

    measured = candidates.sim_config

    def from_flags(profile, base, candidate, slowdown):
        config = measured(profile, base, candidate, slowdown)
        return config.replace(slowdown=base.slowdown, compute_ms=base.compute_ms)

    candidates.sim_config = from_flags


def setting_without_keyword() -> None:
    """A communication setting is added to CommSettings' fields without its keyword in the public classes' defs."""
    import dataclasses

    from hetrain.comm import settings

    @dataclasses.dataclass(frozen=True)
    class Added:
        added_setting: int = settings.comm_option(0, help="a setting no public class takes yet")

    declared = settings.comm_fields
    settings.comm_fields = lambda: [*declared(), *dataclasses.fields(Added)]


def evaluation_unshown() -> None:
    """The launcher evaluates the kept models in silence, whatever ``progress`` says (before issue 70)."""
    from hetrain.jobs import evaluation

    evaluation.tqdm = lambda iterable, **settings: iterable


def finish_unannounced() -> None:
    """The bar stays at 100% with nothing said while the workers finish (before issue 70)."""
    from hetrain.jobs import run

    update = run._ProgressBar.update

    def without_the_finish(self, rank, message):
        update(self, rank, message)
        self.bar.set_postfix_str(self.bar.postfix.split("; finishing")[0], refresh=False)

    run._ProgressBar.update = without_the_finish


def plan_sizes_in_fixed_units() -> None:
    """The plan table prints memory in GiB and bytes sent in GB with fixed decimals, whatever their size
    (before issue 70: a tiny model's 0.000)."""
    from hetrain.planner import report

    report.size = lambda nbytes, binary=True: f"{nbytes / 2**30:.3f} GiB" if binary else f"{nbytes / 1e9:.4f} GB"


def launcher_hook_public() -> None:
    """A launcher's hook is public again (``checkpoint_due`` beside ``step`` on every protocol class)."""
    from hetrain.runtime.protocol import SyncProtocol

    SyncProtocol.checkpoint_due = lambda self, wish: self._checkpoint_due(wish)


def every_keyword_taken_as_default() -> None:
    """A public class's keywords all count as left at their defaults: what a call gives is dropped."""
    from hetrain.runtime import public_signature

    public_signature._is_default = lambda value, default: True


def vacant_ranks_not_held_dead() -> None:
    """A job that may grow starts its vacant ranks alive to the others (no dead flag): the originals wait for
    workers that do not exist yet."""
    from hetrain.jobs import members

    class NoVacancies(list):
        def __iter__(self):  # the launcher's marking loop sees none; the rest of the record keeps them
            import inspect

            caller = inspect.stack()[1]
            return iter([]) if caller.function == "run" else list.__iter__(self)

    init = members.Members.__init__

    def without_marks(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.vacant = NoVacancies(self.vacant)

    members.Members.__init__ = without_marks


def joins_never_start() -> None:
    """``--join``'s workers are never started: the job keeps its first size."""
    from hetrain.jobs import members

    members.Members.due = lambda self, training_time_s: []


def worker_sigterm_ignored() -> None:
    """A worker ignores a SIGTERM of its own, as before graceful leaves: it cannot be asked to leave."""
    from hetrain.jobs import leave_signal

    leave_signal.listen = lambda: None


def leave_without_grace() -> None:
    """The launcher lets a worker go at once, before a SIGTERM to the whole job could reach it too."""
    from hetrain.jobs import members

    members.LEAVE_GRACE_S = 0.0


def rate_board_waits_for_every_rank() -> None:
    """The balanced split's rates wait for a count from every rank, a vacant one too (so they never come)."""
    from hetrain.jobs import rate_board

    rate_board.RateBoard.__init__ = _dropping_dead(rate_board.RateBoard.__init__)


def _dropping_dead(init):
    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        kwargs.pop("dead", None)
        init(self, *args, **kwargs)
    return wrapper


def leaver_joins_the_final_average() -> None:
    """A worker that left still takes part in the final average in ``finish()``."""
    from hetrain.runtime.protocol import SyncProtocol

    leave = SyncProtocol.leave

    def leave_and_forget(self, *args, **kwargs):
        left = leave(self, *args, **kwargs)
        self._left = False
        return left

    SyncProtocol.leave = leave_and_forget


def advise_ranks_by_speed_only() -> None:
    """``hetrain advise`` ranks by predicted samples/s alone, the predicted time to target ignored."""
    from hetrain.advisor import candidates

    candidates.rank = lambda predictions: sorted(predictions, key=lambda p: -p["samples_per_s"])


def advise_no_time_to_target() -> None:
    """``hetrain advise`` never runs the simulator's model math: no candidate's time to target is predicted."""
    from hetrain.advisor import candidates

    candidates.predict_accuracy = lambda *args: {"time_to_target_s": None, "accuracy_predicted": False}


def sim_stop_at_target_ignored() -> None:
    """The simulator runs to its time budget whatever the model math asks (``Engine.stop`` does nothing)."""
    from hetrain.sim.engine import Engine

    Engine.stop = lambda self: None


def advise_slow_link_counted_twice() -> None:
    """``hetrain advise`` takes the whole measured all-reduce as the collective step, the emulated links' time
    in it included, though the simulator adds the links' time on its own."""
    from hetrain.advisor import candidates
    from hetrain.sim.network import NetworkParams

    def whole_measurement(profile, base):
        n = profile["num_workers"]
        return NetworkParams(collective_step_us=1000.0 * profile["allreduce_ms"] / (2 * (n - 1)))

    candidates.network_for = whole_measurement


def advise_one_seed() -> None:
    """``hetrain advise`` predicts each time to target from one model-math run, not the median of three."""
    from hetrain.advisor import candidates

    candidates.ACCURACY_SEEDS = 1


def sim_math_momentum_ignored() -> None:
    """The simulator's model math takes plain SGD steps whatever momentum it was given."""
    from hetrain.sim.math_model import DigitsMath

    def plain_step(self, worker):
        self.params[worker] -= self.lr * self.worker_gradient(worker)

    DigitsMath.local_step = plain_step


def ledger_spikes_not_counted() -> None:
    """The compute ledger reports no transient slowdown, however many iterations spiked."""
    from hetrain.jobs.compute_ledger import ComputeLedger

    summary = ComputeLedger.summary

    def without_spikes(self):
        found = summary(self)
        if found.get("iterations"):
            found.update(spike_share=0.0, spike_to_median=None)
        return found

    ComputeLedger.summary = without_spikes


def advise_spikes_not_simulated() -> None:
    """``hetrain advise`` simulates every worker at its measured mean speed, its transient slowdowns left out."""
    from hetrain.advisor import variability

    def mean_speeds(profile, directory, horizon_s, seed):
        fastest = min(profile["compute_ms"])
        spec = ",".join(f"{i}:{c / fastest:.3f}x" for i, c in enumerate(profile["compute_ms"]) if c / fastest >= 1.0005)
        return fastest, spec or "none"

    variability.simulated_slowdown = mean_speeds


def advise_collective_includes_spike_waits() -> None:
    """``hetrain advise`` charges the all-reduce with all the slowest worker waited, the others' spikes included."""
    from hetrain.advisor import candidates

    candidates.collective_ms = lambda profile, base, slowdown: profile["allreduce_ms"]


def speed_basis_counts_the_start() -> None:
    """The emulated speed basis averages every compute phase, the start's (a collective inside) too."""
    from hetrain.jobs.compute_ledger import ComputeLedger

    ComputeLedger.mean_achieved_s = lambda self: sum(self.achieved_s) / self.iterations if self.iterations else None


def ray_joins_only_on_schedule() -> None:
    """A Ray job's vacant ranks wait for a ``--join`` schedule: a node added to the cluster grows no job."""
    from hetrain.ray import growth

    growth.joins_when_room = lambda joins: False


def ray_joins_together() -> None:
    """A Ray job starts every vacant rank the cluster has room for at once (not one join at a time)."""
    from hetrain.ray import growth

    growth.joins_now = lambda placed, replacements: list(placed)


def ray_drains_unseen() -> None:
    """A Ray job does not see a node being drained: its workers are never asked to leave (they die with it)."""
    from hetrain.ray import draining

    draining.draining_nodes = lambda: set()


def ray_growth_unchecked() -> None:
    """``hetrain.ray.run`` takes any ``max_workers`` and ``joins`` and joins the cluster with them."""
    from hetrain.ray import growth

    growth.check_growth = lambda num_workers, max_workers, joins: max_workers or num_workers


def pair_links_one_lock() -> None:
    """``PairLinks`` builds every pair under one lock, held while it waits for the peer (the rule before)."""
    from hetrain.transport import pair_links

    def link(self, peer, incarnations=(0, 0)):
        key = (peer, *incarnations)
        with self._lock:
            self._building.setdefault(key, None)
            group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = pair_links.pair_group(self.job, self.name, peer, incarnations, cpu=self.cpu)
        return group, 0 if peer < self.job.rank else 1

    pair_links.PairLinks.link = link


def deal_own_counter() -> None:
    """Each worker counts its own epochs' batches (a counter of its own in the store): every worker takes
    every batch of every epoch."""
    from hetrain import epoch_deal

    def claim(self, epoch):
        return int(self.store.add(f"{id(self)}/{epoch}", 1)) - 1

    epoch_deal.StoreClaims.claim = claim


def deal_joiner_from_epoch_zero() -> None:
    """A joining worker starts at epoch 0 (it counts its way through the epochs that are over)."""
    from hetrain import epoch_deal

    epoch_deal.StoreClaims.current = lambda self: 0


def deal_order_per_worker() -> None:
    """Each worker shuffles each epoch in an order of its own: the batch index it is dealt picks other samples
    than another worker's same index would."""
    from hetrain import epoch_deal

    enter = epoch_deal.EpochSampler._enter

    def _enter(self, epoch):
        enter(self, epoch)
        self._order = torch.randperm(len(self.x), generator=torch.Generator().manual_seed(id(self) % 2**31 + epoch))

    epoch_deal.EpochSampler._enter = _enter


def left_rank_stays_gone() -> None:
    """A rank whose worker left is never vacant again (the rule before): a join waiting for it never starts."""
    from hetrain.jobs import members

    members.Members.vacate = lambda self, rank: None


def ray_left_rank_keeps_no_room() -> None:
    """A Ray rank whose worker left asks for no room of its own again: it never becomes vacant."""
    from hetrain.ray import actors

    actors.RayWorkers.renew_vacancy = lambda self, rank: False


def ray_workers_niced() -> None:
    """Ray's workers keep the niceness Ray starts them at (15): on a busy node they yield to everything."""
    from hetrain.ray import actors

    actors.WORKER_RUNTIME_ENV = {}


def ps_joiners_unserved() -> None:
    """The parameter server never takes in a worker that joined (the rule before: its members were fixed)."""
    from hetrain.runtime.parameter_server import ParameterServer

    ParameterServer.rejoined = lambda self: set()


def ps_joiner_counted_from_zero() -> None:
    """The parameter server counts a joining worker's pushes from 0: under staleness it holds every other
    worker back until the newcomer has pushed as often as they did."""
    from hetrain.protocols import ps_logic

    def join(self, worker):
        step = ps_logic.ServerStep() if worker in self.left else self.leave(worker)
        self.left.discard(worker)
        self.pushes[worker] = 0
        self._at_count[0] = self._at_count.get(0, 0) + 1
        self._slowest = 0
        return step

    ps_logic.ParameterServerLogic.join = join


MUTANTS = {"no-comm": no_comm, "deal-own-counter": deal_own_counter, "left-rank-stays-gone": left_rank_stays_gone,
           "ps-joiner-counted-from-zero": ps_joiner_counted_from_zero,
           "ps-joiners-unserved": ps_joiners_unserved,
           "ray-left-rank-keeps-no-room": ray_left_rank_keeps_no_room, "ray-workers-niced": ray_workers_niced,
           "deal-joiner-from-epoch-zero": deal_joiner_from_epoch_zero, "deal-order-per-worker": deal_order_per_worker, "pair-links-one-lock": pair_links_one_lock, "speed-basis-counts-the-start": speed_basis_counts_the_start,
           "ray-joins-only-on-schedule": ray_joins_only_on_schedule, "ray-drains-unseen": ray_drains_unseen,
           "ray-growth-unchecked": ray_growth_unchecked, "ray-joins-together": ray_joins_together,
           "vacant-ranks-not-held-dead": vacant_ranks_not_held_dead, "joins-never-start": joins_never_start,
           "worker-sigterm-ignored": worker_sigterm_ignored, "leave-without-grace": leave_without_grace,
           "rate-board-waits-for-every-rank": rate_board_waits_for_every_rank,
           "leaver-joins-the-final-average": leaver_joins_the_final_average,
           "advise-ranks-first-candidate": advise_ranks_first_candidate,
           "advise-profile-from-flags": advise_profile_from_flags,
           "advise-ranks-by-speed-only": advise_ranks_by_speed_only, "advise-no-time-to-target": advise_no_time_to_target,
           "advise-one-seed": advise_one_seed, "advise-slow-link-counted-twice": advise_slow_link_counted_twice, "sim-stop-at-target-ignored": sim_stop_at_target_ignored, "sim-math-momentum-ignored": sim_math_momentum_ignored, "ledger-spikes-not-counted": ledger_spikes_not_counted,
           "advise-spikes-not-simulated": advise_spikes_not_simulated,
           "advise-collective-includes-spike-waits": advise_collective_includes_spike_waits,
           "hop-update-to-first-out-neighbour-only": hop_update_to_first_out_neighbour_only,
           "hop-graph-not-repaired": hop_graph_not_repaired, "keyframes-always": keyframes_always,
           "ps-answers-the-first-worker": ps_answers_the_first_worker, "arrivals-not-progress": arrivals_not_progress,
           "calibration-sticks": calibration_sticks, "ddp-wait-as-work": ddp_wait_as_work, "standalone-ignores-achieved": standalone_ignores_achieved,
           "unauthenticated-peer-accepted": unauthenticated_peer_accepted,
           "arrivals-progress-forever": arrivals_progress_forever,
           "anchors-in-the-model-s-code": anchors_in_the_model_s_code, "orphaned-job-dirs-kept": orphaned_job_dirs_kept,
           "long-tempdir-forkserver": long_tempdir_forkserver,
           "outer-defaults-diloco-always": outer_defaults_diloco_always,
           "resumed-from-own-iteration": resumed_from_own_iteration,
           "hop-resumed-from-own-iteration": hop_resumed_from_own_iteration, "record-unheld": record_unheld,
           "comparison-goes-on-after-a-stop": comparison_goes_on_after_a_stop, "every-worker-scores-the-final-model": every_worker_scores_the_final_model, "one-queue-for-all": one_queue_for_all, "workers-die-on-sigterm": workers_die_on_sigterm,
           "results-whole-through-the-pipe": results_whole_through_the_pipe, "replaced-edge-kept": replaced_edge_kept, "powersgd-cold-resume": powersgd_cold_resume,
           "own-state-from-rank-0": own_state_from_rank_0, "resume-with-nothing-left": resume_with_nothing_left,
           "restart-after-the-end-refused": restart_after_the_end_refused,
           "any-torchrun-attempt-finishes": any_torchrun_attempt_finishes,
           "deaths-on-the-raw-clock": deaths_on_the_raw_clock, "topology-by-its-path": topology_by_its_path,
           "refusal-as-a-dump": refusal_as_a_dump, "rewound-epoch-claimed-again": rewound_epoch_claimed_again,
           "mid-fit-load-deferred": mid_fit_load_deferred, "late-updates-as-models": late_updates_as_models,
           "progress-with-the-mixing": progress_with_the_mixing,
           "loaded-weights-as-progress": loaded_weights_as_progress, "reanchor-outer-only": reanchor_outer_only, "replacements-admitted-together": replacements_admitted_together, "unsettled-replacements-kept": unsettled_replacements_kept,
           "freeze-after-the-wait": freeze_after_the_wait, "first-sends-unwatched": first_sends_unwatched, "idle-edges-bounded": idle_edges_bounded, "finished-neighbours-sent-to": finished_neighbours_sent_to,
           "interim-edges-ignored": interim_edges_ignored, "link-ingress-own-rule": link_ingress_own_rule, "server-not-last": server_not_last,
           "iteration-from-logic": iteration_from_logic, "outer-step-on-own-anchor": outer_step_on_own_anchor,
           "anchors-kept-local": anchors_kept_local, "anchor-at-build": anchor_at_build,
           "rows-by-steps": rows_by_steps, "no-steps-weighting": no_steps_weighting,
           "preduce-unweighted": preduce_unweighted,
           "no-circulation-weighting": no_circulation_weighting, "circulation-by-own-steps": circulation_by_own_steps, "ps-final-from-server": ps_final_from_server,
           "outer-step-without-exchange": outer_step_without_exchange,
           "fingerprint-without-comm": fingerprint_without_comm, "free-collectives": free_collectives,
           "topk-random-indices": topk_random_indices, "decoders-scaled": decoders_scaled,
           "int4-one-value-per-byte": int4_one_value_per_byte,
           "admitted-before-start": admitted_before_start, "data-split-ignored": data_split_ignored, "balance-ignored": balance_ignored, "rates-from-a-few-batches": rates_from_a_few_batches, "no-dead-band": no_dead_band,
           "momentum-unmixed": momentum_unmixed, "momentum-unbound-after-load": momentum_unbound_after_load,
           "momentum-bound-only-at-the-step": momentum_bound_only_at_the_step, "momentum-in-the-model-s-code": momentum_in_the_model_s_code,
           "sign-scaled-by-the-largest": sign_scaled_by_the_largest, "sign-bits-reversed": sign_bits_reversed, "topk-sample-trusted": topk_sample_trusted, "compressed-preduce-unweighted": compressed_preduce_unweighted, "quantized-in-the-input": quantized_in_the_input, "topk-ties-as-topk-likes": topk_ties_as_topk_likes, "topk-nan-below-threshold": topk_nan_below_threshold, "sparse-topk-zeros-from-the-end": sparse_topk_zeros_from_the_end, "sparse-topk-first-k": sparse_topk_first_k, "late-stop-unreported": late_stop_unreported, "warm-server-started-unblocked": warm_server_started_unblocked, "bit-packing-on-any-byte-order": bit_packing_on_any_byte_order, "attempt-store-unprefixed": attempt_store_unprefixed, "ready-only-at-the-barrier": ready_only_at_the_barrier,
           "stale-replicas-across-edges": stale_replicas_across_edges, "free-gg-requests": free_gg_requests,
           "ingress-in-arrival-order": ingress_in_arrival_order,
           "no-shared-start": no_shared_start, "plan-shards-frozen": plan_shards_frozen,
           "plan-bias-on-every-rank": plan_bias_on_every_rank, "plan-flat-reductions": plan_flat_reductions,
           "plan-update-unlike-the-whole-model": plan_update_unlike_the_whole_model,
           "plan-replicas-disagree": plan_replicas_disagree, "plan-verdict-ignores-replicas": plan_verdict_ignores_replicas,
           "cli-reference-without-last-flag": cli_reference_without_last_flag,
           "compare-writes-no-plot": compare_writes_no_plot,
           "citations-left-as-they-were": citations_left_as_they_were, "part-titles-dropped": part_titles_dropped,
           "unplaced-citations-unreported": unplaced_citations_unreported,
           "record-citations-unseen": record_citations_unseen,
           "setting-without-keyword": setting_without_keyword, "every-keyword-taken-as-default": every_keyword_taken_as_default,
           "launcher-hook-public": launcher_hook_public, "evaluation-unshown": evaluation_unshown,
           "finish-unannounced": finish_unannounced, "plan-sizes-in-fixed-units": plan_sizes_in_fixed_units}
