"""An Accelerate training loop synchronized by hetrain's Prague (``HetrainSync``, shaped like ``LocalSGD``).

    accelerate launch --multi_gpu --num_processes 4 examples/accelerate_prague.py
    accelerate launch --multi_gpu --num_processes 4 examples/accelerate_prague.py --protocol hop
    torchrun --standalone --nproc-per-node 4 examples/accelerate_prague.py     # the same thing

On a machine without GPUs, ``--multi_gpu`` is what starts several processes (Accelerate
runs torchrun), and the script's ``Accelerator(cpu=True)`` makes them a multi-CPU job on
gloo; ``--cpu --num_processes 4`` starts one process only (Accelerate 1.16's multi-CPU
launch goes through MPI and ``--mpirun_hostfile``). Add ``--main_process_port`` to run two
jobs side by side. A small conv net with BatchNorm learns scikit-learn's digits; the loop is
Accelerate's usual one, over ``sync.shared_loader(loader)``: the epochs shared out by speed
(``--static-shards``: Accelerate's prepared loader, the same number of batches on every process).
Each batch sleeps ``--compute-ms`` times the process's slowdown before its forward pass
(``--slowdown 0:3x``: process 0 three times slower; default none). ``--protocol allreduce`` is
Accelerate's own DDP (HetrainSync passes it through), the baseline. With ``--out DIR`` every
process writes ``rank<R>.pt`` (its final weights) and ``rank<R>.json`` (times, batches, accuracy,
the protocol's metrics).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hetrain.data import load_dataset
from hetrain.integrations.accelerate import HetrainSync  # before Accelerator(): see its docstring
from hetrain.registry import PROTOCOL_NAMES
from hetrain.slowdown import parse_slowdown


def make_model() -> nn.Module:
    torch.manual_seed(0)  # the same initial model on every process
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 4 * 4, 10))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--protocol", choices=PROTOCOL_NAMES, default="prague")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", default=None)
    parser.add_argument("--compute-ms", type=float, default=0.0, help="emulated compute per batch (a sleep)")
    parser.add_argument("--slowdown", default="none", help="a hetrain slowdown spec, e.g. 0:3x")
    parser.add_argument("--static-shards", action="store_true", help="Accelerate's prepared loader, not shared")
    parser.add_argument("--save-state", default=None, help="accelerator.save_state(DIR) after training (the "
                        "protocol's state included: accelerator.register_for_checkpointing(sync))")
    parser.add_argument("--load-state", default=None, help="accelerator.load_state(DIR) before training")
    parser.add_argument("--accumulate", type=int, default=1, help="gradient accumulation steps (accelerator.accumulate)")
    parser.add_argument("--one-cycle", action="store_true", help="a OneCycleLR through accelerator.prepare, sized "
                        "as Accelerate's docs do: the whole epoch's batches x epochs / accumulation")
    args = parser.parse_args()
    slowdown = parse_slowdown(args.slowdown)

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accumulate)
    data = load_dataset("digits")
    loader = DataLoader(TensorDataset(data.x_train, data.y_train), batch_size=32, shuffle=True)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = None
    if args.one_cycle:
        total = len(loader) * args.epochs // args.accumulate
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=total)
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    else:
        model, optimizer = accelerator.prepare(model, optimizer)
    if args.static_shards:
        loader = accelerator.prepare_data_loader(loader)
    rank, batches, losses = accelerator.process_index, 0, []

    start = time.time()
    sync = HetrainSync(accelerator, model, optimizer, protocol=args.protocol)
    accelerator.register_for_checkpointing(sync)  # the protocol's counters, anchors and loader epochs
    if args.load_state:
        accelerator.load_state(args.load_state)  # applied to the protocol when the block builds it
    with sync:
        resumed_iteration = sync.sync.stats.iteration if sync.sync is not None else 0
        if not args.static_shards:
            loader = sync.shared_loader(loader)  # each epoch shared out by speed
        for _ in range(args.epochs):
            model.train()
            for x, y in loader:
                time.sleep(args.compute_ms / 1000 * slowdown.factor(rank, batches))
                batches += 1
                with accelerator.accumulate(model):
                    optimizer.zero_grad()
                    loss = nn.functional.cross_entropy(model(x), y)
                    accelerator.backward(loss)
                    optimizer.step()  # then the protocol synchronizes (Prague: a group's P-Reduce)
                    if scheduler is not None:
                        scheduler.step()
                losses.append(accelerator.gather_for_metrics(loss.detach()))  # inside the block: this process's
            accelerator.wait_for_everyone()  # inside the block: returns at once (the processes run apart)
    end = time.time()  # leaving the block waited for the final average
    if args.save_state:
        accelerator.save_state(args.save_state)  # a barrier: after the block, where every process arrives

    net = accelerator.unwrap_model(model).eval()
    with torch.no_grad():
        accuracy = (net(data.x_test).argmax(1) == data.y_test).float().mean().item()
    accelerator.print(f"{args.protocol}: test accuracy {accuracy:.4f} (every process holds the same model)")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        torch.save(net.state_dict(), out / f"rank{rank}.pt")
        (out / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "test_accuracy": accuracy, "start": start,
                                                          "end": end, "batches": batches,
                                                          "resumed_iteration": resumed_iteration,
                                                          "losses_logged": len(losses),
                                                          "schedule": None if scheduler is None else {
                                                              "total_steps": scheduler.scheduler.total_steps,
                                                              "last_epoch": scheduler.scheduler.last_epoch},
                                                          "loader_epoch": getattr(loader, "epoch", None),
                                                          "metrics": sync.metrics()}, default=str))
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
