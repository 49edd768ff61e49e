"""A run's figures over time, written by the launcher of ``hetrain train`` / ``compare`` (``--log``).

The launcher writes, not the workers: one run (one TensorBoard event file, one W&B or MLflow run)
per training run, and the job-wide figures are the launcher's to form. Steps are milliseconds of the
job's training clock (so runs of different protocols line up in time); walltime is the clock time
of that moment.

Live, in a local job: every worker's progress report (every 0.25 s) carries its protocol's counters
(:func:`hetrain.loggers.protocol_logger.worker_figures`); once per ``interval_s`` (1 s) of
training the launcher writes ``throughput/samples_per_s`` (all workers, over the last interval),
``workers/live``, ``workers/iteration_spread`` (the most advanced live worker's iteration minus the
least advanced's), ``comm/bytes_sent`` (all workers, so far) and each worker's ``worker{r}/...``
figures (:mod:`hetrain.loggers.protocol_logger`).

After the run, from its record (what ``metrics.json`` holds): ``eval/accuracy`` and ``eval/loss``
of the averaged model at each snapshot tick (it is formed from the workers' snapshots after the
run: :mod:`hetrain.jobs.evaluation`), ``train/loss`` (the workers' mean, per 5 s window) and
``efficiency/heterogeneity`` per 5 s window (the window's samples/s over the run's ideal samples/s:
:func:`hetrain.metrics.build_metrics`). Under torchrun no live report reaches a launcher, so the
record also gives ``throughput/samples_per_s`` (5 s windows) and one point of each worker's whole-run
figures at the end.
"""

from __future__ import annotations

import time
import warnings

from hetrain.loggers.protocol_logger import figure_scalars

LIVE_INTERVAL_S = 1.0


def step_of(t_s: float) -> int:
    """The step of a moment of the training clock: its milliseconds."""
    return int(round(t_s * 1000))


class RunLogger:
    """Feed it the workers' reports (``on_message``), deaths and joins; ``finish(metrics)`` at the end."""

    def __init__(self, writer, num_workers: int, batch_size: int, interval_s: float = LIVE_INTERVAL_S):
        self.writer = writer
        self.num_workers = num_workers
        self.batch_size = batch_size
        self.interval_s = interval_s
        self.latest: dict[int, dict] = {}  # rank -> its last report with figures
        self.at_write: dict[int, dict] = {}  # rank -> its report as of the last write
        self.dead: set[int] = set()
        self.started_at: float | None = None  # time.time() at the training clock's 0
        self.written_t_s: float | None = None
        self.live_points = 0
        self.failed = False  # a writer failed: warned once, the run goes on without the figures

    # -- live --------------------------------------------------------------------------------
    def on_message(self, rank: int, message) -> None:
        if self.failed or not isinstance(message, dict) or "figures" not in message:
            return
        start = time.time() - message["t_s"]
        self.started_at = start if self.started_at is None else min(self.started_at, start)
        self.at_write.setdefault(rank, message)  # a worker's first report: where its rates count from
        self.latest[rank] = message
        t_s = max(m["t_s"] for m in self.latest.values())
        if t_s >= (self.written_t_s or 0.0) + self.interval_s:
            self._guarded(self.write_live, t_s)

    def on_death(self, rank: int) -> None:
        self.dead.add(rank)

    def on_join(self, rank: int) -> None:
        """A replacement counts from zero: its rates count from its own first report."""
        self.dead.discard(rank)
        self.latest.pop(rank, None)
        self.at_write.pop(rank, None)

    def write_live(self, t_s: float) -> None:
        step, walltime = step_of(t_s), self._walltime(t_s)
        live = {r: m for r, m in self.latest.items() if r not in self.dead}
        scalars = {"workers/live": self.num_workers - len(self.dead),
                   "comm/bytes_sent": sum(m["figures"]["bytes_sent"] for m in self.latest.values()),
                   "throughput/samples_per_s": self.batch_size * sum(self._rate(r, m) for r, m in live.items())}
        if live:
            iterations = [m["figures"]["iteration"] for m in live.values()]
            scalars["workers/iteration_spread"] = max(iterations) - min(iterations)
        for rank in sorted(live):
            before = self.at_write.get(rank)
            figures = figure_scalars(live[rank]["figures"], before["figures"] if before else None)
            scalars.update({f"worker{rank}/{name}": value for name, value in figures.items()})
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step, walltime)
        self.writer.flush()
        self.at_write.update(live)
        self.written_t_s = t_s
        self.live_points += 1

    def _rate(self, rank: int, report: dict) -> float:
        """Iterations per second of ``rank`` since the last write (or its first report), on its own
        reports' clock (reports of different workers arrive up to 0.25 s apart); 0 when it has not
        reported since."""
        before = self.at_write[rank]
        elapsed = report["t_s"] - before["t_s"]
        return (report["computed"] - before["computed"]) / elapsed if elapsed > 0 else 0.0

    # -- after the run -----------------------------------------------------------------------
    def finish(self, metrics: dict) -> None:
        """Write what only the run's record has (see the module), in step order; then flush."""
        if not self.failed:
            self._guarded(self._finish, metrics)

    def _finish(self, metrics: dict) -> None:
        last_t = max((m["t_s"] for m in self.latest.values()), default=None)
        if last_t is not None and last_t > (self.written_t_s or 0.0):
            self.write_live(last_t)  # the workers' last reports (after their final average)
        if self.started_at is None:
            self.started_at = time.time() - metrics["wall_time_s"]
        points = record_points(metrics, live=self.live_points > 0)
        for t_s, tag, value in sorted(points, key=lambda p: p[0]):
            self.writer.add_scalar(tag, value, step_of(t_s), self._walltime(t_s))
        self.writer.flush()

    def close(self) -> None:
        self._guarded(self.writer.close)

    def _guarded(self, write, *args) -> None:
        """Run ``write``; a failing logger (a full disk, a tracking server gone) costs the figures, not the run."""
        try:
            write(*args)
        except Exception as exc:
            if not self.failed:
                warnings.warn(f"--log: writing the figures failed ({type(exc).__name__}: {exc}); the run goes "
                              "on without them", stacklevel=2)
            self.failed = True

    def _walltime(self, t_s: float) -> float:
        return (self.started_at if self.started_at is not None else time.time() - t_s) + t_s


def record_points(metrics: dict, live: bool) -> list[tuple[float, str, float]]:
    """``(t_s, tag, value)`` from a run's record; ``live``: the live figures were written already."""
    points = []
    for point in metrics.get("accuracy_curve") or []:
        if point.get("accuracy_avg_model") is not None:
            points.append((point["t_s"], "eval/accuracy", point["accuracy_avg_model"]))
        if point.get("loss_avg_model") is not None:
            points.append((point["t_s"], "eval/loss", point["loss_avg_model"]))
    ideal = metrics.get("ideal_samples_per_s")
    for window in metrics.get("throughput_series") or []:
        if ideal:
            points.append((window["t_s"], "efficiency/heterogeneity", window["samples_per_s"] / ideal))
        if not live:
            points.append((window["t_s"], "throughput/samples_per_s", window["samples_per_s"]))
    points += [(t_s, "train/loss", loss) for t_s, loss in train_loss_windows(metrics.get("workers") or [])]
    if not live:
        points += _whole_run_worker_points(metrics)
    # two ticks may pick the same snapshots (the same moment, the same model): one point each
    return list({(t_s, tag): (t_s, tag, value) for t_s, tag, value in points}.values())


def train_loss_windows(workers: list[dict]) -> list[tuple[float, float]]:
    """The workers' mean training loss per window (windows by index, as the job's series)."""
    series = [w["throughput_series"] for w in workers if w.get("throughput_series")]
    windows = []
    for index in range(min((len(s) for s in series), default=0)):
        losses = [s[index]["train_loss"] for s in series if s[index].get("train_loss") is not None]
        if losses:
            windows.append((max(s[index]["t_s"] for s in series), sum(losses) / len(losses)))
    return windows


def _whole_run_worker_points(metrics: dict) -> list[tuple[float, str, float]]:
    """Each worker's figures over the whole run, at its end (torchrun: no live reports)."""
    t_s, points = metrics["wall_time_s"], []
    for worker in metrics.get("workers") or []:
        figures = {"compute_s": worker.get("compute_s", 0.0), "wait_s": worker.get("wait_s", 0.0),
                   "exchanges": worker.get("exchanges", 0), "bytes_sent": worker.get("bytes_sent", 0)}
        if "queued_updates_max" in worker:  # Hop's counters: the record has no queue length now, but staleness
            figures.update(updates_stale=worker.get("updates_stale", 0),
                           max_iteration_gap=worker.get("max_iteration_gap", 0))
        for name, value in figure_scalars(figures, None).items():
            points.append((t_s, f"worker{worker['rank']}/{name}", value))
    return points
