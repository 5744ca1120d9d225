"""A Lightning program with CkptDashCallback and real experiment loggers, run by the logger tests.

Every Trainer gets the loggers named in ``--loggers`` (``tensorboard``, ``csv``, ``wandb``,
``mlflow``) writing under ``LOG_ROOT`` and logs ``loss`` and ``tag`` (``--tag``: which launch
logged a value) at every step; ModelCheckpoint saves every ``--save-every`` steps.
``--kill-at N``: rank 0 SIGKILLs the whole job (its process group) at step N, without
warning (after a 0.3 s stall); ``--signal-at N``: rank 0 sends itself SIGUSR2 at step N
(save, requeue, stop).
``--devices 2`` trains two gloo ranks (Lightning's ddp re-executes this script for rank 1).
Rank 0 writes ``REPORT`` (json) at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from ckptdash.lightning import CkptDashCallback


class Tiny(pl.LightningModule):  # type: ignore[misc]
    """A linear model on random data that logs its loss and the launch's tag."""

    def __init__(self, tag: float, kill_at: int, signal_at: int, step_s: float) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.tag, self.kill_at, self.signal_at, self.step_s = tag, kill_at, signal_at, step_s

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        step = self.trainer.global_step
        if self.global_rank == 0 and step == self.kill_at:
            # The job stalls a moment (its pulses show where it got), then the node is gone:
            # the whole process group dies, no handler runs.
            threading.Event().wait(0.3)
            os.killpg(os.getpgid(0), signal.SIGKILL)
        if self.global_rank == 0 and step == self.signal_at:
            os.kill(os.getpid(), signal.SIGUSR2)
        if self.step_s:
            threading.Event().wait(self.step_s)  # slow steps: pulses see where the job got
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("loss", loss)
        self.log("tag", self.tag)
        return loss

    def train_dataloader(self) -> Any:
        data = torch.utils.data.TensorDataset(torch.randn(64, 4))
        return torch.utils.data.DataLoader(data, batch_size=4)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def make_loggers(names: list[str], root: Path) -> list[Any]:
    out: list[Any] = []
    for name in names:
        if name == "tensorboard":
            from lightning.pytorch.loggers import TensorBoardLogger

            out.append(TensorBoardLogger(root / "tb"))
        elif name == "csv":
            from lightning.pytorch.loggers import CSVLogger

            out.append(CSVLogger(root / "csv"))
        elif name == "wandb":
            from lightning.pytorch.loggers import WandbLogger

            out.append(WandbLogger(project="exp", save_dir=str(root), offline=True))
        elif name == "mlflow":
            from lightning.pytorch.loggers import MLFlowLogger

            out.append(MLFlowLogger("exp", tracking_uri=f"file:{root / 'mlruns'}"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("log_root", type=Path)
    parser.add_argument("report", type=Path)
    parser.add_argument("--loggers", default="tensorboard,csv,wandb,mlflow")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--kill-at", type=int, default=-1)
    parser.add_argument("--signal-at", type=int, default=-1)
    parser.add_argument("--step-s", type=float, default=0.0)
    parser.add_argument("--tag", type=float, default=0.0)
    parser.add_argument("--devices", type=int, default=1)
    args = parser.parse_args()
    callback = CkptDashCallback(
        args.run_dir, agree_interval_s=0.001, poll_interval_s=0.01, pulse_interval_s=0.02
    )
    every = ModelCheckpoint(
        dirpath=args.run_dir / "mc", every_n_train_steps=args.save_every, save_top_k=-1
    )
    trainer = pl.Trainer(
        default_root_dir=args.run_dir,
        max_steps=args.steps,
        callbacks=[callback, every],
        logger=make_loggers(args.loggers.split(","), args.log_root),
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
    )
    trainer.fit(Tiny(args.tag, args.kill_at, args.signal_at, args.step_s))
    if trainer.global_rank == 0:
        report = {"global_step": trainer.global_step, "pid": os.getpid()}
        args.report.write_text(json.dumps(report) + "\n")


if __name__ == "__main__":
    main()
