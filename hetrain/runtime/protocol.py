"""What every synchronization protocol shares: the PyTorch-facing API and the step/finish template.

A protocol wraps a model (and optionally its optimizer) like torch's own
averagers do, and synchronizes after every optimizer step::

    with hetrain.Hop(model, optimizer, topology="ring") as sync:   # process_group=None: the world
        for x, y in batches:
            loss = loss_fn(model(x), y)
            optimizer.zero_grad(); loss.backward()
            optimizer.step()                  # the step post-hook runs sync.step(): send, wait, average
    # leaving the block: drain, average over all workers (every worker ends with the consensus
    # model), release threads, sockets and groups; on an exception only the release

Without an optimizer, call ``sync.step()`` after each of your own updates.
``should_stop(local_done)`` says when to leave a loop whose workers may stop at
different times (All-Reduce's workers must agree; the others stop on their own).

Timing: the time between two ``step`` calls is compute, the time inside is
waiting (communication the protocol could not hide); ``restart_clock()`` marks
the start of the first iteration's compute (default: the end of construction).
Subclasses implement ``_sync`` and, where they hold resources, ``_finish``,
``_release`` and ``_extra_state``/``_load_extra_state``.

Failures: with ``on_failure="abort"`` (default) a lost peer fails the worker
with an error naming it. With ``"continue"``, ``dead_workers()`` (the local
launcher's record of who died) tells the protocol whom to route around:
Hop/D-PSGD repair their graph, Prague and AD-PSGD skip groups with the dead
(their Group Generator stops grouping them), the parameter server stops
waiting for them; ``finish`` averages over the survivors. With
``"respawn"`` the same happens, and a dead worker's replacement (a new
process for the same rank, one *incarnation* later) joins: ``rejoined()``
names ranks that came back, the protocols connect to their new process over
new communicators and hand them the model (Hop/D-PSGD: the neighbours' last
models; Prague/AD-PSGD: the newcomer's first groups average it in with weight
zero). A replacement's own protocol is built with ``joining`` true.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from hetrain.comm import settings as comm_carrier
from hetrain.comm.local_work import StepTimer, steps_per_exchange
from hetrain.comm.settings import CommSettings
from hetrain.errors import UsageError, WorkerError
from hetrain.protocols.membership import ON_FAILURE
from hetrain.protocols.options import OptionError
from hetrain.runtime.flat_state import FlatState
from hetrain.runtime.outer_step import OuterStep
from hetrain.runtime.progress import ProgressBeacon
from hetrain.runtime.speed_board import SpeedBoard
from hetrain.transport.device_thread import synchronize, wait_work
from hetrain.transport.job import DEFAULT_TIMEOUT_S, model_device
from hetrain.transport.link_spec import ring_allreduce_bytes
from hetrain.transport.membership import Membership
from hetrain.transport.worker_transport import Transport


def comm_from(comm: CommSettings | None, settings: dict, owner: str) -> CommSettings:
    """The communication settings of a public class: ``comm`` as given, or built from the communication
    keywords among the ``settings`` its call gave (taken out of it: the rest are the protocol's options;
    :func:`~hetrain.runtime.public_signature.keywords_given`)."""
    keywords = {f.name for f in comm_carrier.comm_fields()} | {"link"}  # link: a LinkSpec for the two link fields
    given = {name: settings.pop(name) for name in list(settings) if name in keywords}
    if comm is None:
        return comm_carrier.CommSettings.from_keywords(**given)
    if given:
        raise TypeError(f"{owner}() takes comm= or communication keywords, not both (got {sorted(given)})")
    if not isinstance(comm, comm_carrier.CommSettings):
        raise TypeError(f"{owner}() comm= must be a CommSettings, got {type(comm).__name__}")
    return comm


@dataclass
class ProtocolStats:
    """Counters every protocol reports (per worker); protocol-specific ones go in ``extra``."""

    iterations: int = 0  # local steps this process computed in this run (not counting a predecessor's)
    iteration: int = 0  # the worker's one iteration counter, in local steps: one up per step
    # (SyncProtocol.step), counting on from a resumed or replaced predecessor's; Hop adds the steps of the
    # exchanges it skips (sync_every each) and a replacement starts from the models it adopts
    skipped_iterations: int = 0
    compute_s: float = 0.0
    wait_s: float = 0.0
    updates_stale: int = 0
    updates_dropped: int = 0
    max_iteration_gap: int = 0
    exchanges: int = 0  # synchronizations (every sync_every local steps)
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        data = asdict(self)
        data.update(data.pop("extra"))
        return data


def _inner_kind(optimizer: torch.optim.Optimizer | None) -> str | None:
    """``sgd`` for torch's SGD (with or without momentum), else the optimizer's class name (None: none given)."""
    if optimizer is None:
        return None
    return "sgd" if isinstance(optimizer, torch.optim.SGD) else type(optimizer).__name__.lower()


def _outer_step(model: nn.Module, comm: CommSettings) -> OuterStep | None:
    """The outer optimizer ``comm`` names (SGD, with Nesterov momentum for DiLoCo's, over the model's parameters),
    or the optimizer object given from Python; None for plain averaging."""
    if not isinstance(comm.outer_optimizer, str):
        return OuterStep(model, comm.outer_optimizer)
    if comm.outer_optimizer == "none":
        return None
    return OuterStep(model, torch.optim.SGD(model.parameters(), lr=comm.resolved_outer_lr,
                                            momentum=comm.resolved_outer_momentum,
                                            nesterov=comm.outer_optimizer == "nesterov"))


class SyncProtocol:
    """Base class; see the module docstring. ``name`` is the registry's protocol name.

    The launcher's hooks start with an underscore: hetrain's launchers, its Lightning strategy and the
    shells call them, a training loop of one's own needs none (``_steps_together``, ``_checkpoint_due``,
    ``_backward_wait_s``, ``_inherit_iteration``, ``_align_resumed_iteration``, ``_worker_left``,
    ``_announce_joined``, ``_announce_settled``; docs/decisions/launcher-hooks-off-the-user-surface.md).
    """

    name = "base"
    _steps_together = False  # whether every worker takes the same steps (All-Reduce: DDP's lockstep)
    outer_gossips_anchors = False  # True: the anchors are averaged beside the models (Prague, AD-PSGD)
    outer_mixes_momentum = False  # True: the outer momentum is averaged beside the models (Hop, D-PSGD)

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, *, options=None,
                 comm: CommSettings | None = None, process_group=None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 on_failure: str = "abort", dead_workers: Callable[[], set[int]] | None = None,
                 transport: Transport | None = None):
        if on_failure not in ON_FAILURE:
            raise OptionError(f"{{on_failure}} must be one of {', '.join(ON_FAILURE)}, got {on_failure!r}")
        self.model = model
        self.options = options  # the protocol's options object (None: a protocol without options)
        self.on_failure = on_failure
        self.tolerant = on_failure != "abort"  # continue or respawn: route around the dead
        if transport is None:  # today's: the view of process_group, the deaths dead_workers names
            transport = Transport.of(process_group, model_device(model), timeout_s, self.name, dead_workers)
        elif process_group is not None or dead_workers is not None:
            raise TypeError(f"{type(self).__name__}() takes transport= or process_group=/dead_workers=, not both")
        self.transport = transport
        reported = transport.membership if self.tolerant else None  # abort: a death fails the worker
        self.membership = reported or Membership()  # who is in the job, typed
        self.dead_workers = reported  # the same object, None where nobody reports deaths
        self.dead: set[int] = set()  # workers this one knows to be dead
        self.job = transport.job
        # respawn: each rank's process number as this worker knows it (the launcher's LauncherMembership)
        self._membership = self.membership if self.membership.replaces else None
        self.incarnations = self._membership.incarnations() if self._membership else [0] * self.job.world_size
        self.incarnation = self._membership.incarnation if self._membership else 0
        self.joining = self.incarnation > 0  # a replacement joining a running job
        if self.joining:  # the deaths so far (a rank dead now comes back as a rejoin)
            self.dead = set(self.dead_workers()) - {self.job.rank}
        elif self._membership is not None:
            # an original knows the job as it started, every rank at process 0: a rank replaced before this
            # worker built its protocol (a death during start-up) is a join at its first look, owed a model.
            # Taken as an original, it was waited on for tokens while it waited for a model (Ray, start-up
            # kills: "worker 1 waited 60 s for a token from worker(s) [0]", docs/decisions/replacement-admitted-during-start-up.md)
            self.incarnations = [0] * self.job.world_size
        # an outer lr and momentum not given follow the optimizer inside (SlowMo's with SGD, DiLoCo's else)
        self.comm = (comm or comm_carrier.CommSettings()).for_inner(_inner_kind(optimizer)).validate(self.job.world_size)
        self._outer = _outer_step(model, self.comm)
        gossip = self._outer is not None and self.outer_gossips_anchors
        extra = []  # what travels with the model: the anchors (combine, then adapt) or the outer momentum
        if gossip:
            extra = self._outer.anchor
        elif self._outer is not None and self.outer_mixes_momentum:
            extra = self._outer.mix_momentum()
        self.state = FlatState(model, extra=extra)
        if gossip:
            self._outer.state = self.state
        self.stats = ProtocolStats()
        self._setup_comm()
        self._hooks = [model.register_load_state_dict_post_hook(self._after_weights_loaded)]
        if optimizer is not None:
            self._hooks.append(optimizer.register_step_post_hook(self._after_optimizer_step))
        if self._outer is not None:
            if optimizer is not None:
                self._hooks.append(optimizer.register_step_pre_hook(self._before_optimizer_step))
            if self._outer.load_hook is not None:  # the mixed momentum bound at each load of the outer optimizer
                self._hooks.append(self._outer.load_hook)
        self._finished = False
        self._released = False
        self._left = False  # leave(): the launcher let this worker go
        self._last_step_end = time.perf_counter()
        self._last_exchange_end = self._last_step_end

    def _setup_comm(self) -> None:
        comm = self.comm
        self.sync_every = comm.sync_every
        self.local_work = comm.local_work
        self.compression = comm.compression
        shapes = [tuple(t.shape) for t in self.state.tensors]
        self.gossip_step = float(comm.gossip_step) if comm.gossip_step is not None else \
            self.compression.default_gossip_step(self.state.numel, shapes)
        self.link = self.transport.link(comm.link)
        if self.options is not None:
            self.options.check_comm(comm)  # what this protocol refuses (allreduce: local steps, ...)
        self._local_steps = 0  # local steps since the last exchange
        self._steps_this_exchange = comm.sync_every
        self._step_timer = StepTimer()
        self._speeds = SpeedBoard(self.job) if comm.local_work == "auto" and self.job.world_size > 1 else None
        self._beacon = ProgressBeacon.of(self.job)  # finishing workers wait for a straggler while it steps

    # -- the PyTorch-facing surface ---------------------------------------------------------
    @property
    def module(self) -> nn.Module:
        """The module to run forward on: the model itself (All-Reduce: DistributedDataParallel's wrapper)."""
        return self.model

    def __enter__(self) -> SyncProtocol:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.finish()
        else:
            self.close()
        return False

    def restart_clock(self) -> None:
        """Mark now as the start of the next iteration's compute (e.g. after a barrier)."""
        self._last_step_end = time.perf_counter()
        if self._local_steps == 0:
            self._last_exchange_end = self._last_step_end

    def _align_resumed_iteration(self) -> None:
        """``--resume``, once every worker of the job has loaded its own file (at the same point: the
        launcher's resume path calls it on every original worker): bring the workers' counters to one
        point where the protocol needs it (Hop, D-PSGD). Nothing by default."""

    def _lowest_of_workers(self, value: int, what: str) -> int:
        """The lowest ``value`` over the job's workers (an all-reduce: every worker calls it at the same point)."""
        lowest = torch.tensor([float(value)], dtype=torch.float64, device=self.job.device)
        try:
            wait_work(self.job.all_reduce(lowest, dist.ReduceOp.MIN), self.job.timeout, self.job.nccl, what)
        except Exception as exc:
            raise WorkerError(f"worker {self.job.rank} waited for the others' {what}: {exc}") from None
        return int(lowest.item())

    def reanchor(self) -> None:
        """Take the model as it is now as the outer optimizer's anchor (and as the point Hop's
        ``late_updates="progress"`` measures its own steps from): call it after loading weights into
        the model other than by ``model.load_state_dict`` (which re-anchors by itself), or they count
        as progress (a pseudo-gradient, steps put back) at the next exchange. A no-op without either."""
        if self._outer is not None:
            self._outer.capture()
        self._weights_replaced()

    def step(self) -> None:
        """Count a local step (called by the step post-hook when an optimizer was given); every
        ``sync_every`` of them (or as ``local_work="auto"`` sizes it), synchronise."""
        if self._finished:
            raise RuntimeError(f"{self.name}: step() after finish()")
        synchronize(self.job.device)  # on a GPU: the step's kernels count as compute, not as the wait after
        if self.stats.iterations == 0:
            self.membership.note_ready()  # built: replacements may join now (no start barrier in some loops)
        if self._outer is not None:
            self._outer.pending_capture = False  # the anchor is the model the first step started from
        now = time.perf_counter()
        step_s = now - self._last_step_end
        self.stats.compute_s += step_s
        self.stats.iterations += 1
        self.stats.iteration += 1  # one up per local step (Hop's skips add theirs)
        if self._beacon is not None:
            self._beacon.beat(self.stats.iterations)
        self._local_steps += 1
        self._step_timer.add(step_s)
        if self._local_steps < self._steps_this_exchange:
            self._last_step_end = time.perf_counter()
            self._after_step_loggers()
            return
        if self._outer is not None and not self.outer_gossips_anchors:
            self._outer.step()  # adapt, then the exchange combines (see hetrain.runtime.outer_step)
        self._sync()
        if self._outer is not None and self._averaged():  # no outer step without an exchange
            if not self.outer_gossips_anchors:
                self._outer.capture()  # the exchange's average is the next anchor
            elif not self._outer_step_delayed():
                self._outer.apply()  # combined, now adapt: the averaged anchor, the averaged pseudo-gradient
        self.stats.exchanges += 1
        self._local_steps = 0
        self._steps_this_exchange = self._next_local_steps()
        synchronize(self.job.device)  # the exchange's kernels (NCCL's wait only orders the stream)
        end = time.perf_counter()
        self.stats.wait_s += end - now
        self._last_step_end = self._last_exchange_end = end
        self._after_step_loggers()

    _step_loggers: tuple = ()  # what log_to attached (hetrain.loggers.protocol_logger)

    def log_to(self, writer, every: int = 1, prefix: str | None = None):
        """Write this worker's figures (wait fraction, exchanges, bytes sent; Hop and D-PSGD: queue length
        and staleness) to ``writer`` after every ``every``-th step, tagged ``worker{rank}/...`` (or ``prefix``).

        ``writer``: anything with ``add_scalar(tag, value, step)`` (TensorBoard's SummaryWriter, hetrain's
        writers); the step is the worker's iteration. Returns the
        :class:`~hetrain.loggers.protocol_logger.ProtocolLogger` (call it to write now; ``stop()``).
        """
        from hetrain.loggers.protocol_logger import ProtocolLogger

        logger = ProtocolLogger(self, writer, every, prefix)
        self._step_loggers = (*self._step_loggers, logger)
        return logger

    def _after_step_loggers(self) -> None:
        for logger in self._step_loggers:
            logger.after_step()

    def _next_local_steps(self) -> int:
        """Local steps before the next exchange: ``sync_every``, or sized to this worker's speed (auto)."""
        if self.local_work != "auto":
            return self.sync_every
        own = self._step_timer.step_s
        fastest = own
        if self._speeds is not None:
            self._speeds.publish(own)
            fastest = self._speeds.fastest(own, exclude=self.dead)
        steps = steps_per_exchange(self.sync_every, own, fastest)
        self.stats.extra["local_steps_last"] = steps
        return steps

    def _slowest_steps(self) -> int | None:
        """Under ``local_work="auto"``: the local steps the slowest live worker takes per exchange, as this
        worker's speed board reads them (None: nothing measured yet)."""
        if self._speeds is None:
            return None
        times = self._speeds.times(self._step_timer.step_s, exclude=self.dead)
        return steps_per_exchange(self.sync_every, max(times), min(times)) if times else None

    def _pay_vote(self, nbytes: int) -> None:
        """A small all-reduce over the whole group (a stop vote) pays the emulated links: its ring's bytes
        and 2(n-1) latencies."""
        n = self.job.world_size
        sent = ring_allreduce_bytes(n, nbytes)
        self.link.collective(range(n), sent, sent, 2 * (n - 1))

    def _averaged(self) -> bool:
        """Whether the last ``_sync`` took part in an exchange (AD-PSGD's and Prague's syncs may form no
        group: no outer step then, and the anchor stays, so the next pseudo-gradient spans both)."""
        return True

    def _outer_step_delayed(self) -> bool:
        """Whether this protocol applies the outer step itself, when a delayed average lands (Prague's overlap)."""
        return False

    @property
    def steps_this_exchange(self) -> int:
        """Local steps behind the model this worker sends at its next (or current) exchange."""
        return self._local_steps or self._steps_this_exchange

    def compression_stats(self) -> dict:
        """Bytes this worker sent and received, and what compression saved: ``bytes_sent``,
        ``bytes_received``, ``compression`` and ``compression_ratio`` (float32 bytes over bytes sent)."""
        link = self.link.counters()
        uncompressed = self.stats.extra.get("uncompressed_bytes", 0)
        return {"compression": str(self.compression), "bytes_sent": link["bytes_sent"],
                "bytes_received": link["bytes_received"],
                "compression_ratio": uncompressed / self.stats.extra["compressed_bytes"]
                if self.stats.extra.get("compressed_bytes") else 1.0}

    def should_stop(self, local_done: bool) -> bool:
        """Whether to leave the loop; ``local_done`` is this worker's own wish.

        Decentralized protocols let each worker stop on its own (``finish``
        drains); All-Reduce overrides this so its workers leave together.
        """
        return bool(local_done)

    def _checkpoint_due(self, wish: bool) -> bool:
        """Whether to checkpoint now, given this worker's ``wish``. Workers checkpoint on their own,
        except where they must agree on the iteration (All-Reduce: at its stop votes)."""
        return wish

    def finish(self) -> None:
        """Drain what is in flight, leave every worker with the consensus model, release resources."""
        if self._finished:
            return
        self._finished = True
        if self._left:  # the others went on without it: nothing to drain, no final average to join
            self.close()
            return
        try:
            if self._beacon is not None:
                self._beacon.beat(self.stats.iterations, now_or_never=True)  # the count the others name, exact
            self._finish()
        finally:
            self.close()

    def leave(self, timeout_s: float | None = None) -> bool:
        """Leave the job between two steps, gracefully: ask the launcher to let this worker go and wait
        until it does. The others then route around this worker as around a death (Hop and D-PSGD repair
        their graph, the Group Generator stops grouping it) but no death is recorded, and no replacement
        starts; what this worker last sent (its last update, its last group's average) is what it hands
        on. Returns True once let go: stop stepping, and ``finish()`` releases without the final average
        (the others average without this worker). Returns False when the job is ending first (finish as
        usual). Needs a launcher that tracks members (``hetrain train``, ``run_local``, Ray) and a
        protocol that routes around the dead (``on_failure`` continue or respawn).
        """
        if not self.membership.can_leave:
            raise UsageError(f"{self.name}.leave() needs a hetrain launcher that tracks members (hetrain train, "
                             "hetrain.jobs.run_local, Ray) and on_failure continue or respawn")
        bound = self.job.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + bound
        self.membership.ask_to_leave()
        while not self.membership.let_go():
            if self.membership.ending():
                return False
            if time.monotonic() > deadline:
                raise WorkerError(f"worker {self.job.rank} asked to leave the job and was not let go within "
                                  f"{bound:.0f} s")
            time.sleep(0.01)
        self._left = True
        self.stats.extra["left"] = True
        return True

    def close(self) -> None:
        """Release threads, sockets and groups without waiting for anyone (also after an error)."""
        if self._released:
            return
        self._released = True
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self._release()

    def _backward_wait_s(self) -> float:
        """Seconds this iteration's backward pass waited for communication (a protocol that communicates
        inside backward says; the emulated compute leaves them out of the work it completes)."""
        return 0.0

    def metrics(self) -> dict:
        if self.dead:
            self.stats.extra["workers_known_dead"] = sorted(self.dead)
        pool = self.state.pool
        self.stats.extra.update(flat_buffers_reused=pool.reused, flat_buffers_allocated=pool.allocated)
        self.stats.extra.update(self.link.counters())
        self.stats.extra.update(sync_every=self.sync_every, local_work=self.local_work,
                                compression=str(self.compression),
                                compression_ratio=self.compression_stats()["compression_ratio"])
        if self._outer is not None:
            self.stats.extra["outer_steps"] = self._outer.steps
        return self.stats.as_dict()

    def new_deaths(self) -> set[int]:
        """Deaths the launcher reported since the last call (continue mode; empty otherwise)."""
        if self.dead_workers is None:
            return set()
        new = set(self.dead_workers()) - self.dead - {self.job.rank}
        self.dead |= new
        return new

    def _worker_left(self, rank: int) -> None:
        """Tell the services this process runs that ``rank`` died (continue mode, where no hetrain
        launcher does it: e.g. under Lightning). Prague and AD-PSGD's Group Generator, served by
        rank 0, stops grouping it; a no-op elsewhere."""

    def rejoined(self) -> set[int]:
        """Ranks whose replacement joined since the last call (respawn; empty otherwise).

        Also a rank that died and came back between two calls (never seen dead
        here): its incarnation went up, so its old process and communicators are gone.
        """
        if self._membership is None:
            return set()
        dead, now = self._membership(), self._membership.incarnations()
        back = {r for r in range(self.job.world_size)
                if r != self.job.rank and r not in dead and (r in self.dead or now[r] > self.incarnations[r])}
        for r in back:
            self.incarnations[r] = now[r]
        self.dead -= back
        if back:
            self.stats.extra["workers_rejoined_seen"] = self.stats.extra.get("workers_rejoined_seen", 0) + len(back)
        return back

    def _inherit_iteration(self, iteration: int) -> None:
        """A replacement: go on counting from its predecessor's iteration (protocols that take the
        iteration from their neighbours, as Hop does, keep theirs)."""
        if self.joining and iteration > self.stats.iteration:
            self.stats.iteration = iteration

    def _announce_joined(self) -> None:
        """A replacement: tell the launcher this process is ready to be talked to."""
        if self._membership is not None and self.joining:
            self._membership.announce_joined(self.job.timeout_s)

    def _announce_settled(self) -> None:
        """A replacement: tell the launcher this process holds the job's model now (it counts in the
        final average from here on; before, the launcher stops it if the job ends first)."""
        if self._membership is not None and self.joining:
            self._membership.announce_settled()

    def state_dict(self) -> dict:
        """The protocol's own state (counters and, per protocol, what resuming needs); not the model's."""
        state = {"protocol": self.name, "iteration": self.stats.iteration, "iterations": self.stats.iterations,
                 "local_steps": self._local_steps, **self._extra_state()}
        if self._outer is not None:
            state["outer"] = self._outer.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if state.get("protocol") != self.name:
            raise ValueError(f"a {state.get('protocol')!r} state cannot be loaded into {self.name}")
        self.stats.iteration = int(state["iteration"])  # the counter goes on; ``iterations`` counts this run
        self.stats.extra["iterations_before_resume"] = int(state["iterations"])
        self._local_steps = int(state.get("local_steps", 0))
        if self._outer is not None and state.get("outer") is not None:
            self._outer.load_state_dict(state["outer"])
        self._load_extra_state(state)

    # -- for subclasses -----------------------------------------------------------------------
    def _after_optimizer_step(self, optimizer, args, kwargs) -> None:
        self.step()

    def _before_optimizer_step(self, optimizer, args, kwargs) -> None:
        """The first optimizer step: the model it starts from is the first anchor (weights loaded after
        the protocol was built, by any means, are not progress)."""
        if self._outer.pending_capture and self._local_steps == 0:
            self._outer.capture()

    def _after_weights_loaded(self, module, incompatible_keys) -> None:
        """``model.load_state_dict`` into the wrapped model: the loaded weights are the anchor
        (a protocol state loaded afterwards, as ``--resume`` does, brings the saved anchor back)."""
        if self._outer is not None:
            self._outer.capture()
            self._outer.pending_capture = self.stats.iterations == 0 and self._local_steps == 0
        self._weights_replaced()

    def _weights_replaced(self) -> None:
        """Weights were loaded into the model from outside the protocol (Hop: not its own progress)."""

    def _sync(self) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        """Drain and reach consensus (collective: every worker calls it)."""

    def _release(self) -> None:
        """Free threads, sockets and groups; must not block on other workers."""

    def _extra_state(self) -> dict:
        return {}

    def _load_extra_state(self, state: dict) -> None:
        pass
