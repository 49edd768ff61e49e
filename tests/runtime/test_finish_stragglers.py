"""Ranks that stop far apart end in consensus (issue 38): a finishing worker waits for a straggler as
long as it takes steps (hetrain.runtime.progress), and fails, naming it, when it takes none.

The hook API on 4 gloo workers with ``timeout_s`` 1.5 s: workers 0-2 take 3 steps and finish, worker 3
takes steps for ~4.5 s (3x the timeout) before it finishes. Before issue 38 the early workers failed
after one timeout ("still waiting after 2 s for its peer to stop", or in the final average).
"""

import time

import pytest
import torch
from torch import nn

from hetrain.errors import WorkerError
from hetrain.jobs.local_job import run_local
from hetrain.registry import get_spec

TIMEOUT_S = 1.5


def _straggler_job(ctx, protocol, straggler_s, hang):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    spec = get_spec(protocol)
    sync = spec.runtime_class()(model, opt, timeout_s=TIMEOUT_S, **({"seed": 0} if spec.seeded else {}))
    gen = torch.Generator().manual_seed(ctx.rank)
    last = ctx.rank == ctx.world_size - 1
    start, steps = time.monotonic(), 0
    while steps < 3 or (last and time.monotonic() - start < straggler_s):
        x = torch.randn(8, 4, generator=gen)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        steps += 1
        if last:
            time.sleep(0.05)
    if last and hang:
        time.sleep(60)  # alive, but no step and no finish: the others must give up on it
    sync.finish()
    return [v for p in model.parameters() for v in p.detach().flatten().tolist()], steps  # floats: no shared memory


@pytest.mark.timeout(120)
@pytest.mark.parametrize("protocol", ["hop", "prague", "ps", *(pytest.param(p, marks=pytest.mark.slow)  # CI time
                                                       for p in ("dpsgd", "adpsgd"))])
def test_workers_finished_early_wait_for_a_straggler_that_still_steps(processes, protocol):
    results = run_local(_straggler_job, 4, (protocol, 3 * TIMEOUT_S, False), timeout_s=TIMEOUT_S,
                        job_timeout_s=90)
    assert results[3][1] > 3 * results[0][1]  # the straggler trained on long after the others stopped
    for params, _ in results[1:]:
        assert params == pytest.approx(results[0][0], abs=1e-6)  # one consensus model


@pytest.mark.timeout(120)
def test_a_straggler_that_stops_stepping_is_given_up_on_naming_it(processes):
    start = time.monotonic()
    with pytest.raises(WorkerError, match="worker 3|workers \\[3\\]"):
        run_local(_straggler_job, 4, ("hop", 0.5, True), timeout_s=TIMEOUT_S, job_timeout_s=90)
    assert time.monotonic() - start < 30
