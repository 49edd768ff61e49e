"""A Lightning strategy conformance run (issue 38): Lightning's own BoringModel, 2 CPU ranks that
Lightning starts, rank 0 slower; every rank writes what it saw to OUT/rank{r}.json.

    python tests/integrations/lightning_conformance.py --strategy hop --case features --out DIR

Cases:
  features  OneCycleLR (--schedule cosine: CosineAnnealingLR) sized by trainer.estimated_stepping_batches
            (interval "step"), val_check_interval=0.5, accumulate_grad_batches=2, gradient clipping,
            two epochs; then test() and predict()
  resume    one epoch with a ModelCheckpoint (save_last), then fit(ckpt_path=last) for a second one
  maxsteps  max_steps=STEPS with rank 0 10x slower than rank 1
  limits    limit_train_batches=0.5, check_val_every_n_epoch=2, four epochs
  more      bf16-mixed precision, two validation loaders, val_check_interval as an int, EarlyStopping on a
            logged validation loss, then validate()
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from torch.utils.data import DataLoader


class Model(BoringModel):
    def __init__(self, case: str, slow_ms: float, schedule: str = "onecycle"):
        super().__init__()
        self.case, self.slow_ms, self.schedule = case, slow_ms, schedule
        self.validations = 0
        self.tested = self.predicted = 0
        self.seen_loaders: set = set()
        self.val_epochs: list = []

    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 64), batch_size=1, shuffle=True)  # shuffled: shared out by speed

    def training_step(self, batch, batch_idx):
        if self.slow_ms and self.global_rank == 0:
            time.sleep(self.slow_ms / 1000)
        elif self.slow_ms:
            time.sleep(self.slow_ms / 10000)
        return super().training_step(batch, batch_idx)

    def val_dataloader(self):
        if self.case != "more":
            return super().val_dataloader()
        return [DataLoader(RandomDataset(32, 8), batch_size=2), DataLoader(RandomDataset(32, 4), batch_size=2)]

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        out = super().validation_step(batch, batch_idx)
        if self.case == "more":
            self.log("val_loss", out["x"], sync_dist=True)
            self.seen_loaders.add(dataloader_idx)
        return out

    def on_validation_epoch_end(self):
        if not self.trainer.sanity_checking:
            self.validations += 1
            self.val_epochs.append(self.trainer.current_epoch)

    def test_step(self, batch, batch_idx):
        self.tested += 1
        return super().test_step(batch, batch_idx)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        self.predicted += 1
        return super().predict_step(batch, batch_idx, dataloader_idx)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        if self.case != "features":
            return opt
        total = self.trainer.estimated_stepping_batches
        if self.schedule == "cosine":
            scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
        else:
            scheduler = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=total)
        return [opt], [{"scheduler": scheduler, "interval": "step"}]


class Record(Callback):
    """The protocol's state as fit() starts (after a resume: what was loaded)."""

    def __init__(self):
        self.start_state = None

    def on_train_start(self, trainer, module):
        sync = getattr(trainer.strategy, "sync", None)
        if sync is not None:
            self.start_state = _jsonable(sync.state_dict())


def _jsonable(state):
    if isinstance(state, dict):
        return {k: _jsonable(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return [_jsonable(v) for v in state]
    if isinstance(state, torch.Tensor):
        return float(state.double().norm()) if state.numel() > 1 else float(state)
    return state


def strategy_for(name: str, options: dict):
    if name == "ddp":
        return "ddp"
    from hetrain.integrations.lightning import HetrainStrategy

    return HetrainStrategy(name, timeout_s=60, **options)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="hop")
    parser.add_argument("--case", default="features", choices=("features", "resume", "maxsteps", "more", "limits"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--schedule", default="onecycle", choices=("onecycle", "cosine"))
    parser.add_argument("--slow-ms", type=float, default=20.0)
    parser.add_argument("--options", default="{}", help="protocol settings as JSON")
    parser.add_argument("--outer", action="store_true", help="DiLoCo's outer Nesterov step (lr 0.7, momentum 0.9)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    options = json.loads(args.options)
    model = Model(args.case, args.slow_ms, args.schedule)
    if args.outer:
        options["outer_optimizer"] = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    common = dict(accelerator="cpu", devices=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                  num_sanity_val_steps=0, default_root_dir=str(out))  # Lightning's default checkpoints go under OUT
    record = Record()
    report: dict = {}
    started = time.monotonic()
    if args.case == "features":
        trainer = Trainer(strategy=strategy_for(args.strategy, options), max_epochs=2, val_check_interval=0.5,
                          accumulate_grad_batches=2, gradient_clip_val=1.0, limit_val_batches=2,
                          enable_checkpointing=False, callbacks=[record], **common)
        trainer.fit(model)
        report["params_after_fit"] = [float(p.detach().double().sum()) for p in model.parameters()]
        scheduler = trainer.lr_scheduler_configs[0].scheduler
        report.update(estimated=trainer.estimated_stepping_batches,
                      total_steps=getattr(scheduler, "total_steps", getattr(scheduler, "T_max", None)),
                      last_epoch=scheduler.last_epoch, final_lr=scheduler.get_last_lr()[0],
                      validations=model.validations, global_step=trainer.global_step,
                      batches=trainer.strategy.metrics().get("batches_taken_last_epoch")
                      if hasattr(trainer.strategy, "metrics") else None)
        trainer.test(model, verbose=False)
        trainer.predict(model)
        report.update(tested=model.tested, predicted=model.predicted)
    elif args.case == "resume":
        ckpt = ModelCheckpoint(dirpath=out / "ckpt", save_last=True)
        first = Trainer(strategy=strategy_for(args.strategy, options), max_epochs=1, callbacks=[ckpt, Record()],
                        **common)
        first.fit(model)
        saved = torch.load(out / "ckpt" / "last.ckpt", weights_only=False)
        report["saved_state"] = _jsonable(saved.get("hetrain"))
        model = Model(args.case, args.slow_ms)
        if args.outer:
            options["outer_optimizer"] = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
        second = Trainer(strategy=strategy_for(args.strategy, options), max_epochs=2, callbacks=[record], **common)
        second.fit(model, ckpt_path=out / "ckpt" / "last.ckpt")
        report["final_state"] = _jsonable(second.strategy.sync.state_dict()) if hasattr(second.strategy, "sync") \
            else None
    elif args.case == "limits":
        trainer = Trainer(strategy=strategy_for(args.strategy, options), max_epochs=4, limit_train_batches=0.5,
                          check_val_every_n_epoch=2, limit_val_batches=2, enable_checkpointing=False,
                          callbacks=[record], **common)
        trainer.fit(model)
        taken = trainer.strategy.metrics().get("batches_taken_last_epoch") if hasattr(trainer.strategy, "sync") \
            else trainer.num_training_batches
        report.update(validations=model.validations, batches_last_epoch=taken, global_step=trainer.global_step,
                      val_epochs=model.val_epochs)
    elif args.case == "more":
        from lightning.pytorch.callbacks import EarlyStopping

        stop = EarlyStopping(monitor="val_loss/dataloader_idx_0", patience=0, min_delta=1e9)  # stops at the 2nd
        trainer = Trainer(strategy=strategy_for(args.strategy, options), max_epochs=4, val_check_interval=8,
                          precision="bf16-mixed", callbacks=[record, stop], enable_checkpointing=False, **common)
        trainer.fit(model)
        report.update(validations=model.validations, loaders=sorted(model.seen_loaders), epoch=trainer.current_epoch,
                      stopped_epoch=stop.stopped_epoch, global_step=trainer.global_step)
        metrics = trainer.validate(model, verbose=False)
        report.update(validate_metrics=[{k: float(v) for k, v in m.items()} for m in metrics])
    else:
        trainer = Trainer(strategy=strategy_for(args.strategy, options), max_steps=args.steps,
                          limit_val_batches=0, enable_checkpointing=False, callbacks=[record], **common)
        trainer.fit(model)
        report.update(global_step=trainer.global_step)
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    report.update(rank=rank, start_state=record.start_state, fit_s=time.monotonic() - started,
                  params=[float(p.detach().double().sum()) for p in model.parameters()])
    (out / f"rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
