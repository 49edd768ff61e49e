"""The launcher and the training app: local multi-process jobs, and the worker loop of ``hetrain train``.

- :func:`run_local` runs ``fn(ctx, *args)`` on N local worker processes forming one
  torch.distributed job (warm workers, deaths, respawn, Ctrl-C): the public launcher API,
  used by ``hetrain train``, the planner's ``--measure`` and ``profile``, and the tests;
- :mod:`hetrain.jobs.run` runs one training job and writes its record;
  :mod:`hetrain.jobs.train_worker` is the loop every worker runs.

The library's protocol shells and their transport stay in :mod:`hetrain.runtime`.
"""

from hetrain.jobs.local_job import JobResults, run_local

__all__ = ["JobResults", "run_local"]
