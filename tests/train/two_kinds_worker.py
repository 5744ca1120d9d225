"""A Lightning job that saves both kinds of checkpoint, run by ``test_lightning_two_kinds``.

Two ModelCheckpoints, as people combine them: every ``--every`` steps a full checkpoint
(with ``last.ckpt``, ``--save-last``: ``true`` or ``link``) and, every 3 steps, a
weights-only "best" one (``save_weights_only=True``, monitoring the step, so each is the
new best). ``--kill-at N``: SIGKILL itself at step N, no handler runs. ``--ckpt-path``:
given to ``fit``.
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from ckptdash.lightning import CkptDashCallback


class Tiny(pl.LightningModule):  # type: ignore[misc]
    """A linear model on random data; SIGKILLs itself at step ``kill_at``."""

    def __init__(self, kill_at: int) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.kill_at = kill_at

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.trainer.global_step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("loss", loss)
        return loss

    def train_dataloader(self) -> Any:
        data = torch.utils.data.TensorDataset(torch.randn(64, 4))
        return torch.utils.data.DataLoader(data, batch_size=4)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def both_kinds(run: Path, every: int, save_last: bool | str) -> list[ModelCheckpoint]:
    """The full periodic ModelCheckpoint and the weights-only best one."""
    full = ModelCheckpoint(
        dirpath=run / "full", every_n_train_steps=every, save_top_k=-1, save_last=save_last
    )
    best = ModelCheckpoint(
        dirpath=run / "best",
        filename="best-{step}",
        monitor="step",
        mode="max",
        every_n_train_steps=3,
        save_top_k=1,
        save_weights_only=True,
    )
    return [full, best]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run", type=Path)
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--save-last", default="true")
    parser.add_argument("--kill-at", type=int, default=-1)
    parser.add_argument("--ckpt-path", default=None)
    args = parser.parse_args()
    save_last: bool | str = True if args.save_last == "true" else args.save_last
    trainer = pl.Trainer(
        default_root_dir=args.run,
        max_steps=args.max_steps,
        callbacks=[
            CkptDashCallback(args.run, pulse_interval_s=0),
            *both_kinds(args.run, args.every, save_last),
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(Tiny(args.kill_at), ckpt_path=args.ckpt_path)


if __name__ == "__main__":
    main()
