"""Train your own model with hetrain's Hop protocol inside your own loop, under torchrun.

    torchrun --standalone --nproc-per-node 4 examples/train_custom.py --steps 200

Every rank trains a user-defined model on its own shard of a synthetic
regression task in a plain PyTorch loop; Hop synchronizes from the optimizer's
step post-hook (it averages with the ring neighbours after each step), and
leaving the ``with`` block drains the queues and leaves every rank with the
consensus model (on an exception it only releases threads and sockets).
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

    # reads RANK, WORLD_SIZE, MASTER_ADDR... set by torchrun. Hop's channels need gloo (NCCL does not match
    # messages by tag); with a GPU the model stays on it and messages go through the host.
    device = hetrain.init(backend="gloo", timeout_s=60, device="cuda" if torch.cuda.is_available() else "cpu")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # same initial model everywhere
    model = TinyRegressor().to(device)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    true_w = torch.linspace(-1, 1, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    protocol = hetrain.Hop if args.protocol == "hop" else hetrain.DPSGD

    with protocol(model, optimizer, topology="ring") as sync:  # process_group=None: the whole job
        for _ in range(args.steps):
            x = torch.randn(64, 16, generator=gen)
            loss = nn.functional.mse_loss(model(x.to(device)), (x @ true_w).to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()  # the step post-hook runs sync.step(): send, wait as Hop says, average

    x = torch.randn(512, 16, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        final_loss = nn.functional.mse_loss(model(x.to(device)), (x @ true_w).to(device)).item()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
    digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]
    reports = [None] * world_size
    dist.all_gather_object(reports, {"rank": rank, "digest": digest, "loss": final_loss, **sync.metrics()})
    if rank == 0:
        print(f"final loss {final_loss:.4f}; model digests {[r['digest'] for r in reports]}")
        if args.out:
            with open(args.out, "w") as handle:
                json.dump(reports, handle, indent=2)
    dist.barrier()  # nobody tears down the job while another rank still talks
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
