"""A Lightning job for tests/integrations/test_lightning.py: where does each rank's epoch end under
HetrainStrategy, whose shared epochs give a rank an unknown share and the loader the length of the epoch
over all ranks? ``python lightning_epoch_end_job.py PROTOCOL OUTDIR DEVICES`` (Lightning's own launcher; on
one device a callback claims a batch of the shared epoch for a second, phantom rank after each batch, so the
one rank's share is about half the loader's length, as it is with two).

30 samples in batches of 1 with ``accumulate_grad_batches=4`` (30 is no multiple of 4: some rank ends an
epoch inside an accumulation window), a loader with 2 workers (they draw index batches ahead of training),
2 epochs, validation at each epoch's end, a StepLR stepped per epoch. Each rank writes what it saw.
"""

import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from hetrain.integrations.lightning import HetrainStrategy


class Job(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
        self.batches = 0
        self.backwards_since_step = 0
        self.never_stepped = 0  # batches trained on whose gradients no optimizer step applied
        self.validated_after = []  # this rank's batches so far at each validation
        self.epoch_ends = []  # this rank's batches so far at each epoch's end

    def training_step(self, batch, batch_idx):
        self.batches += 1
        x, y = batch
        return torch.nn.functional.mse_loss(self.lin(x), y)

    def on_after_backward(self):
        self.backwards_since_step += 1

    def on_before_optimizer_step(self, optimizer):
        self.backwards_since_step = 0

    def on_train_epoch_end(self):
        self.never_stepped += self.backwards_since_step
        self.backwards_since_step = 0
        self.epoch_ends.append(self.batches)

    def validation_step(self, batch, batch_idx):
        return None

    def on_validation_start(self):
        if not self.trainer.sanity_checking:
            self.validated_after.append(self.batches)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.01)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)}


class PhantomRank(pl.Callback):
    """Another rank taking the shared epoch's batches as fast as this one (one claim per batch trained)."""

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        sampler = trainer.strategy.samplers[-1]
        sampler.store.add(f"epoch/{sampler.sampler.epoch}", 1)


if __name__ == "__main__":
    protocol, out, devices = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    module = Job()
    trainer = pl.Trainer(strategy="ddp" if protocol == "ddp" else HetrainStrategy(protocol), accelerator="cpu",
                         devices=devices, callbacks=[PhantomRank()] if devices == 1 else [], max_epochs=2, accumulate_grad_batches=4, num_sanity_val_steps=0, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    train = DataLoader(TensorDataset(torch.randn(30, 4), torch.randn(30, 1)), batch_size=1, shuffle=True,
                       num_workers=2, persistent_workers=True)
    trainer.fit(module, train, DataLoader(TensorDataset(torch.randn(4, 4), torch.randn(4, 1)), batch_size=2))
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps({
        "batches": module.batches, "loader_length": len(trainer.train_dataloader), "never_stepped": module.never_stepped, "epoch_ends": module.epoch_ends,
        "validated_after": module.validated_after, "lr": trainer.optimizers[0].param_groups[0]["lr"]}))
