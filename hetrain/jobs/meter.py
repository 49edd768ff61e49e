"""Speed and memory over time, per worker: samples/s, RSS, TCP connections and training loss per window.

A run's first seconds say little about its tenth minute: a leak or a slowing
protocol shows only over time. Every worker keeps a :class:`WindowMeter`; each
``window_s`` (default 5 s) it closes a window with the samples it processed,
its resident memory at that moment and its mean training loss. The job-wide
series (``hetrain.metrics.job_series``) sums the workers' windows.
"""

from __future__ import annotations

import os
import resource
import sys
import time

DEFAULT_WINDOW_S = 5.0
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_mb() -> float:
    """This process's resident set size now, in MiB (Linux: /proc; elsewhere the peak so far)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * _PAGE_BYTES / 2**20
    except OSError:
        return peak_rss_mb()


def process_started_at() -> float:
    """When this process started, as ``time.time()`` (Linux: from /proc, to the clock tick; else: now)."""
    try:
        with open("/proc/self/stat") as handle:
            start_ticks = int(handle.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as handle:
            uptime_s = float(handle.read().split()[0])
        return time.time() - (uptime_s - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


def peak_rss_mb() -> float:
    """The largest resident set size this process has had, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


def tcp_connections() -> int | None:
    """Established TCP connections this process holds (Linux: /proc; None elsewhere).

    A process's sockets are its ``socket:[inode]`` descriptors; the kernel's
    TCP tables give each inode's state (``01``: established).
    """
    try:
        fd_dir = "/proc/self/fd"
        inodes = set()
        for fd in os.listdir(fd_dir):
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:  # closed meanwhile
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        count = 0
        for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
            with open(table) as handle:
                next(handle)
                for line in handle:
                    fields = line.split()
                    if fields[3] == "01" and fields[9] in inodes:
                        count += 1
        return count
    except OSError:
        return None


class WindowMeter:
    """Accumulate samples (and losses) per ``window_s`` window of a run that starts at t = 0.

    ``record(t_s, samples, loss)`` after each iteration; windows close when an
    iteration ends past their end (a window with no iteration records 0 samples/s).
    ``finish(t_s)`` closes the last, partial window. ``series`` is a list of
    ``{"t_s": window end, "window_s", "samples_per_s", "rss_mb", "tcp_connections", "train_loss"}``.
    """

    def __init__(self, window_s: float = DEFAULT_WINDOW_S):
        if window_s <= 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        self.window_s = window_s
        self.series: list[dict] = []
        self._start_s = 0.0
        self._samples = 0
        self._loss_sum = 0.0
        self._loss_count = 0

    def record(self, t_s: float, samples: int, loss: float | None = None) -> None:
        while t_s >= self._start_s + self.window_s:
            self._close(self._start_s + self.window_s)
        self._samples += samples
        if loss is not None:
            self._loss_sum += loss
            self._loss_count += 1

    def finish(self, t_s: float) -> list[dict]:
        """Close the windows up to ``t_s`` (the last one partial); return the series."""
        self.record(t_s, 0)
        if t_s > self._start_s:
            self._close(t_s)
        return self.series

    def _close(self, end_s: float) -> None:
        duration = end_s - self._start_s
        self.series.append({
            "t_s": round(end_s, 3),
            "window_s": round(duration, 3),  # shorter than the others for the last, partial window
            "samples_per_s": self._samples / duration if duration > 0 else 0.0,
            "rss_mb": round(rss_mb(), 1),
            "tcp_connections": tcp_connections(),
            "train_loss": self._loss_sum / self._loss_count if self._loss_count else None,
        })
        self._start_s = end_s
        self._samples = 0
        self._loss_sum = 0.0
        self._loss_count = 0
