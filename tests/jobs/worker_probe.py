"""A worker function for tests: ``hetrain train``'s worker, then what the worker process had imported.

It lives in a module of its own that imports nothing else, so a worker that runs it loads what the
training app loads and no more.
"""

import sys

from hetrain.jobs.train_worker import train_worker

WATCHED = ("sklearn", "matplotlib", "scipy", "pandas")


def train_then_list_modules(ctx, config, services, data):
    result = train_worker(ctx, config, services, data)
    return {"result": result, "modules": sorted({m.split(".")[0] for m in sys.modules} & set(WATCHED))}
