"""A worker's own protocol figures, written to a scalar writer from any training loop.

The callback the integrations (Lightning, Accelerate) and a user's loop call::

    logger = ProtocolLogger(sync, writer, every=1, prefix=None)
    logger(step=None) -> dict[str, float]    # write this worker's figures now (step None: its iteration)

``writer`` is anything with ``add_scalar(tag, value, step)`` (TensorBoard's ``SummaryWriter``,
hetrain's writers: :mod:`hetrain.loggers.scalar_writers`). ``sync.log_to(writer, every=N)``
(:class:`~hetrain.runtime.protocol.SyncProtocol`) builds one and calls it after every N-th step.
Tags are ``worker{rank}/NAME`` (``prefix`` replaces ``worker{rank}/``), NAME one of

- ``wait_fraction``: the share of the time since the last write spent waiting on the protocol,
  wait / (compute + wait) (the first write: since the start);
- ``exchanges``, ``bytes_sent``: counts since the start (bytes: what this worker's link carried);
- ``queue_length``, ``updates_stale``, ``max_iteration_gap``: Hop and D-PSGD only, which keep update
  queues: updates queued now, stale updates used so far, and the largest gap between this worker's
  iteration and a received update's. The other protocols keep no queue and measure no staleness,
  so these tags are absent for them (not zero).

``worker_figures(sync)`` reads the counters these come from; the launcher of ``hetrain train`` gets
them in every worker's progress report (:mod:`hetrain.loggers.run_logger`).
"""

from __future__ import annotations

QUEUE_FIGURES = ("queue_length", "updates_stale", "max_iteration_gap")


def worker_figures(sync) -> dict:
    """This worker's counters now (cheap: no collective, no copy); Hop and D-PSGD add their queue's."""
    stats = sync.stats
    link = sync.link.counters()
    figures = {"iteration": stats.iteration, "iterations": stats.iterations, "exchanges": stats.exchanges,
               "compute_s": stats.compute_s, "wait_s": stats.wait_s, "bytes_sent": link["bytes_sent"]}
    logic = getattr(sync, "logic", None)
    if logic is not None and hasattr(logic, "queued_updates"):  # Hop's state machine (D-PSGD is a Hop)
        figures.update(queue_length=logic.queued_updates, updates_stale=logic.updates_stale,
                       max_iteration_gap=logic.max_iteration_gap)
    return figures


def figure_scalars(now: dict, before: dict | None) -> dict:
    """The scalars of the module's list from two readings of :func:`worker_figures` (``before``: None at first)."""
    wait = now["wait_s"] - (before["wait_s"] if before else 0.0)
    busy = wait + now["compute_s"] - (before["compute_s"] if before else 0.0)
    scalars = {}
    if busy > 0:
        scalars["wait_fraction"] = wait / busy
    scalars["exchanges"] = now["exchanges"]
    scalars["bytes_sent"] = now["bytes_sent"]
    scalars.update({name: now[name] for name in QUEUE_FIGURES if name in now})
    return scalars


class ProtocolLogger:
    """Writes ``sync``'s figures to ``writer`` when called, and after every ``every``-th step once attached."""

    def __init__(self, sync, writer, every: int = 1, prefix: str | None = None):
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}")
        self.sync = sync
        self.writer = writer
        self.every = every
        self.prefix = f"worker{sync.job.rank}/" if prefix is None else prefix
        self.active = True
        self._before: dict | None = None

    def __call__(self, step: int | None = None) -> dict:
        now = worker_figures(self.sync)
        scalars = figure_scalars(now, self._before)
        step = now["iteration"] if step is None else step
        for name, value in scalars.items():
            self.writer.add_scalar(self.prefix + name, value, step)
        self._before = now
        return scalars

    write = __call__

    def after_step(self) -> None:
        """SyncProtocol.step calls this: write every ``every`` local steps while active."""
        if self.active and self.sync.stats.iterations % self.every == 0:
            self()

    def stop(self) -> None:
        self.active = False
