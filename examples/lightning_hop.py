"""An unmodified LightningModule trained with hetrain's Hop through ``HetrainStrategy``.

    python examples/lightning_hop.py                      # 4 CPU processes, rank 0 three times slower
    python examples/lightning_hop.py --strategy ddp       # Lightning's own DDP, for comparison
    python examples/lightning_hop.py --strategy prague    # or dpsgd, allreduce, adpsgd, ps

Lightning starts the other ranks itself (run it with ``python``, or under
``torchrun --nproc-per-node 4``). A small conv net with BatchNorm learns
scikit-learn's digits; each training batch sleeps ``--compute-ms`` times the
rank's slowdown (``--slowdown 0:3x``: rank 0 three times slower) before its
forward pass, the same under every strategy. With ``--out DIR`` every rank
writes ``rank<R>.json`` (its times, batches, test accuracy and the protocol's
metrics) and ``rank<R>.pt`` (its final weights).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hetrain.data import load_dataset
from hetrain.integrations.lightning import HetrainStrategy
from hetrain.integrations.lightning_slowdown import EmulatedCompute
from hetrain.registry import PROTOCOL_NAMES


class DigitsNet(pl.LightningModule):
    """A plain LightningModule: nothing in it knows about hetrain."""

    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Unflatten(1, (1, 8, 8)),
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 4 * 4, 10))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


class Clock(pl.Callback):
    """When this rank's training started and ended (wall clock, comparable across the ranks of one host).
    With ``marks``, the start also writes ``started.rank<R>`` there (a test waits for it to kill a rank)."""

    def __init__(self, marks: str | None = None):
        self.marks = marks

    def on_train_start(self, trainer, pl_module):
        self.start = time.time()
        if self.marks:
            Path(self.marks).mkdir(parents=True, exist_ok=True)
            (Path(self.marks) / f"started.rank{trainer.global_rank}").touch()

    def on_fit_end(self, trainer, pl_module):
        self.end = time.time()  # after the strategy's on_train_end: the protocol's final average included


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", choices=[*PROTOCOL_NAMES, "ddp"], default="hop")
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--compute-ms", type=float, default=20.0)
    parser.add_argument("--slowdown", default="0:3x")
    parser.add_argument("--topology", default="ring")
    parser.add_argument("--on-failure", default="abort")
    parser.add_argument("--out", default=None, help="each rank writes rank<R>.json and rank<R>.pt here")
    parser.add_argument("--checkpoints", default=None, help="a ModelCheckpoint directory")
    args = parser.parse_args()

    data = load_dataset("digits")
    train = DataLoader(TensorDataset(data.x_train, data.y_train), batch_size=args.batch_size, shuffle=True)
    val = DataLoader(TensorDataset(data.x_test, data.y_test), batch_size=256)
    if args.strategy == "ddp":
        strategy = "ddp"
    else:
        options = {"topology": args.topology} if args.strategy in ("hop", "dpsgd") else {}
        strategy = HetrainStrategy(args.strategy, on_failure=args.on_failure, **options)
    clock, compute = Clock(args.out), EmulatedCompute(args.compute_ms, args.slowdown)
    callbacks = [clock, compute]
    if args.checkpoints:
        callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=args.checkpoints, monitor="val_acc", mode="max"))
    torch.manual_seed(0)  # the same initial model on every rank
    model = DigitsNet()
    trainer = pl.Trainer(strategy=strategy, accelerator="cpu", devices=args.devices, max_epochs=args.epochs,
                         callbacks=callbacks, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=bool(args.checkpoints))
    trainer.fit(model, train, val)

    rank = trainer.global_rank
    report = {"rank": rank, "strategy": args.strategy, "start": clock.start, "end": clock.end,
              "batches": compute.batches, "samples": compute.samples, "compute_s": compute.compute_s,
              "test_accuracy": accuracy(model, data.x_test, data.y_test),
              "logged": {k: float(v) for k, v in trainer.callback_metrics.items()},
              "metrics": strategy.metrics() if isinstance(strategy, HetrainStrategy) else {}}
    if rank == 0:
        print(f"{args.strategy}: rank 0 trained {clock.end - clock.start:.1f} s, {compute.batches} batches, "
              f"test accuracy {report['test_accuracy']:.4f}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), out / f"rank{rank}.pt")
        (out / f"rank{rank}.json").write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
