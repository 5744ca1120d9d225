"""A Lightning program with CkptDashCallback on 2 CPU ranks (gloo), run by the launcher tests.

``--strategy ddp`` re-executes this script for rank 1 (Lightning's subprocess launcher);
``ddp_spawn`` trains in two spawned workers while this process waits. ``--raise-at N``
makes every rank (or only ``--raise-rank R``) raise at step N. ``--ready-at N`` has rank 0
write ``REPORT_DIR/ready`` at step N and slows the steps from then on, so that a test can
signal the launcher while training runs. The launcher process writes
``REPORT_DIR/launcher.json`` at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import traceback
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from ckptdash.lightning import CkptDashCallback


class Tiny(pl.LightningModule):  # type: ignore[misc]
    """A linear model on random data that can raise or announce a step (module level: the
    spawned workers unpickle it)."""

    def __init__(self, report_dir: str, raise_at: int, raise_rank: int, ready_at: int) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.report_dir, self.raise_at, self.ready_at = report_dir, raise_at, ready_at
        self.raise_rank = raise_rank

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        step = self.trainer.global_step
        if step == self.raise_at and self.raise_rank in (-1, self.global_rank):
            raise RuntimeError(f"boom at step {step} on rank {self.global_rank}")
        if 0 <= self.ready_at <= step:
            if step == self.ready_at and self.global_rank == 0:
                (Path(self.report_dir) / "ready").write_text(f"{step}\n")
            threading.Event().wait(0.05)  # a slow step: the test's signal lands in training
        return self.layer(batch[0]).pow(2).mean()

    def train_dataloader(self) -> Any:
        data = torch.utils.data.TensorDataset(torch.randn(400, 4))
        return torch.utils.data.DataLoader(data, batch_size=4)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("report_dir", type=Path)
    parser.add_argument("--strategy", choices=["ddp", "ddp_spawn"], required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--raise-at", type=int, default=-1)
    parser.add_argument("--raise-rank", type=int, default=-1, help="only this rank raises")
    parser.add_argument("--ready-at", type=int, default=-1)
    args = parser.parse_args()
    args.report_dir.mkdir(parents=True, exist_ok=True)
    callback = CkptDashCallback(args.run_dir, agree_interval_s=0.01, poll_interval_s=0.01)
    trainer = pl.Trainer(
        default_root_dir=args.run_dir,
        max_steps=args.steps,
        callbacks=[callback],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        accelerator="cpu",
        devices=2,
        strategy=args.strategy,
    )
    report: dict[str, Any] = {"pid": os.getpid(), "error": None}
    try:
        trainer.fit(Tiny(str(args.report_dir), args.raise_at, args.raise_rank, args.ready_at))
    except BaseException as exc:
        report["error"] = "".join(traceback.format_exception_only(exc))
    report["global_step"] = trainer.global_step
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        (args.report_dir / "launcher.json").write_text(json.dumps(report) + "\n")


if __name__ == "__main__":
    main()
