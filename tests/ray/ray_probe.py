"""Worker functions for the Ray tests (imported by the actors: this directory is on their PYTHONPATH)."""

import os

import torch

import hetrain
from hetrain.jobs.train_worker import train_worker


def where() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def train_reporting_node(ctx, config, services, data):
    """``hetrain train``'s worker, after telling the driver which node and process it runs on."""
    ctx.report({"node": where(), "pid": os.getpid()})
    return train_worker(ctx, config, services, data)


def hook_form_hop(ctx, steps: int):
    """A user's own loop (the hook-form API): a linear model fitted to this rank's own target, Hop over a
    ring; returns the model's weights after the final average, and its node."""
    ctx.report({"node": where(), "pid": os.getpid()})
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    target = torch.full((16, 1), float(ctx.rank))  # each rank pulls towards its own value: only mixing agrees
    x = torch.ones(16, 4)
    with hetrain.Hop(model, optimizer, topology="ring", on_failure=ctx.on_failure, dead_workers=ctx.dead_workers,
                     timeout_s=ctx.timeout_s) as sync:
        if ctx.incarnation == 0:
            ctx.start_barrier()
        done = 0
        while not sync.should_stop(local_done=done >= steps):
            loss = torch.nn.functional.mse_loss(model(x), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            done += 1
            if done % 10 == 0:
                ctx.report({"iteration": done, "computed": done})
    return {"weights": torch.nn.utils.parameters_to_vector(model.parameters()).detach().tolist(),
            "node": where(), "steps": done, "name": process_name()}


def process_name() -> str | None:
    """This process's name as ps and /proc show it (Linux; None elsewhere)."""
    try:
        with open("/proc/self/comm") as handle:
            return handle.read().strip()
    except OSError:
        return None
