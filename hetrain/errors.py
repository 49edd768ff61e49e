"""Errors hetrain raises on purpose.

``UsageError`` is bad input from the user: the CLI prints its one-line message
and exits with code 2. ``WorkerError`` is a failure of a running job (a worker
died, stalled, or waited past its timeout): the CLI prints it and exits 1.
"""


class HetrainError(Exception):
    """Base class of hetrain's own errors."""


class UsageError(HetrainError, ValueError):
    """Bad input: the message says what is wrong and how to fix it."""


class WorkerError(HetrainError, RuntimeError):
    """A running job failed: the message names the worker and what it waited for."""


class Terminated(KeyboardInterrupt):
    """A SIGTERM outside a job's watch loop (start-up, between a comparison's runs): the launcher leaves as
    Ctrl-C leaves there, through its ``finally`` blocks, with exit code 143 (:mod:`hetrain.jobs.interrupts`)."""
