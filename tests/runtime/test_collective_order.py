"""One order of collectives on every rank: no two communicators in flight in different orders.

The static schedule's stop vote is an all-reduce on the world group from the main thread; with
``preduce_overlap`` a step's P-Reduces run on a group communicator from a background thread. Were the
vote posted while a P-Reduce is in flight, ranks could post the two in different orders, which
deadlocks NCCL (gloo's connections happen to tolerate it, so here the order itself is checked).
"""

import torch
import torch.distributed as dist
from torch import nn

from hetrain.jobs.local_job import run_local
from hetrain.runtime.prague import Prague


def _static_prague_with_overlap(ctx):
    torch.manual_seed(ctx.rank)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sync = Prague(model, opt, gg="static", group_size=2, preduce_overlap=1, timeout_s=ctx.timeout_s)
    votes, overlapped = [], 0
    vote = dist.all_reduce

    def checked_vote(*args, **kwargs):  # the stop vote: no P-Reduce may be in flight beside it
        votes.append(sync._background.pending)
        return vote(*args, **kwargs)

    dist.all_reduce = checked_vote
    try:
        step = 0
        while not sync.should_stop(local_done=step >= 12):
            overlapped += sync._background.pending
            opt.zero_grad()
            model(torch.randn(8, 4)).sum().backward()
            opt.step()
            step += 1
    finally:
        dist.all_reduce = vote
    sync.finish()
    return votes, overlapped


def test_the_static_stop_vote_never_overlaps_a_background_preduce(processes):
    for votes, overlapped in run_local(_static_prague_with_overlap, 2, timeout_s=30):
        assert overlapped > 0  # P-Reduces did run in the background between steps
        assert len(votes) >= 5 and not any(votes)  # a vote every period (2 steps) and at the end
