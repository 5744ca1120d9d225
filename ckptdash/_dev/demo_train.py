"""One attempt of the demo's training: a tiny Lightning model with CkptDashCallback.

Run by :mod:`ckptdash.cli.demo`; ``python -m ckptdash._dev.demo_train RUN_DIR STEPS MARKER``.
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Any

import torch


def main(run_dir: str, steps: int, marker: str) -> None:
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from ckptdash.lightning import CkptDashCallback

    class Regressor(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
            )

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("loss", loss)
            time.sleep(0.03)  # a step long enough to watch
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    torch.manual_seed(0)
    x = torch.randn(2048, 16)
    y = x.sum(dim=1, keepdim=True)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
    ckpt = ModelCheckpoint(
        dirpath=Path(run_dir) / "checkpoints", every_n_train_steps=50, save_top_k=-1
    )
    callback = CkptDashCallback(
        run_dir, requeue_command=f"touch {shlex.quote(marker)}", heartbeat_interval_s=0.5
    )
    trainer = L.Trainer(
        max_steps=steps,
        callbacks=[callback, ckpt],
        default_root_dir=run_dir,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(Regressor(), loader)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
