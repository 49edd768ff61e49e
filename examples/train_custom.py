"""Train your own model with hetrain's Hop protocol inside your own loop, under torchrun.

    torchrun --standalone --nproc-per-node 4 examples/train_custom.py --steps 200

Every rank trains a user-defined model on its own shard of a synthetic
regression task; Hop averages models with ring neighbours after each optimizer
step; ``finish`` drains the queues and leaves every rank with the consensus model.
"""

from __future__ import annotations

import argparse
import hashlib
import json

import torch
import torch.distributed as dist
from torch import nn

import hetrain


class TinyRegressor(nn.Module):
    """Any nn.Module works; this one is deliberately not one of hetrain's built-ins."""

    def __init__(self, features: int = 16):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(features, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, x):
        return self.body(x).squeeze(-1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--protocol", choices=["hop", "dpsgd"], default="hop")
    parser.add_argument("--out", default=None, help="rank 0 writes a JSON report here")
    args = parser.parse_args()

    ctx = hetrain.init(timeout_s=60)  # reads RANK, WORLD_SIZE, MASTER_ADDR... set by torchrun
    torch.manual_seed(0)  # same initial model everywhere
    model = TinyRegressor()
    gen = torch.Generator().manual_seed(100 + ctx.rank)  # each rank its own data
    true_w = torch.linspace(-1, 1, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    sync = hetrain.Hop(model, ctx, topology="ring") if args.protocol == "hop" else hetrain.DPSGD(model, ctx)

    step = 0
    while not sync.should_stop(local_done=step >= args.steps):
        x = torch.randn(64, 16, generator=gen)
        y = x @ true_w
        loss = nn.functional.mse_loss(sync.module(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        sync.step()
        step += 1
    sync.finish()

    x = torch.randn(512, 16, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        final_loss = nn.functional.mse_loss(model(x), x @ true_w).item()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]
    reports = [None] * ctx.world_size
    dist.all_gather_object(reports, {"rank": ctx.rank, "digest": digest, "loss": final_loss, **sync.metrics()})
    if ctx.rank == 0:
        print(f"final loss {final_loss:.4f}; model digests {[r['digest'] for r in reports]}")
        if args.out:
            with open(args.out, "w") as handle:
                json.dump(reports, handle, indent=2)
    dist.barrier()  # nobody tears down the job while another rank still talks
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
