"""Lightning: what a LightningModule logs with ``self.log`` reaches the heartbeats (no user
code), and the callback's ``on_anomaly`` stops a run whose logged loss goes NaN."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.train.helpers import state_of

L = pytest.importorskip("lightning.pytorch", reason="install the lightning extra: make test")

from ckptdash.lightning import CkptDashCallback  # noqa: E402


class Diverging(L.LightningModule):  # type: ignore[misc,name-defined]
    """Logs ``loss`` and ``lr`` every step; the loss is NaN from step ``nan_at`` on."""

    def __init__(self, nan_at: int) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.nan_at = nan_at
        self.steps_run: list[int] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        step = self.trainer.global_step
        self.steps_run.append(step)
        loss = self.layer(batch[0]).pow(2).mean()
        if step >= self.nan_at:
            loss = loss * math.nan
        self.log("loss", loss)
        self.log("lr", 0.01)
        return loss

    def train_dataloader(self) -> Any:
        data = torch.utils.data.TensorDataset(torch.randn(128, 4))
        return torch.utils.data.DataLoader(data, batch_size=4)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_logged_metrics_reach_heartbeats_and_a_nan_loss_stops_the_run(tmp_path: Path) -> None:
    """Heartbeats carry the logged ``loss`` and ``lr`` (the metrics plot's data); with
    ``on_anomaly="stop"`` the NaN loss at step 12 is one anomaly event and training stops
    there, well before max_steps, without saving the diverged model."""
    run = tmp_path / "run"
    torch.manual_seed(0)
    model = Diverging(nan_at=12)
    # The squared output of 4 random samples is heavy-tailed: one healthy batch can be 5x the
    # median (the default spike factor) and stop the run first. Only the NaN counts here.
    callback = CkptDashCallback(
        run,
        on_anomaly="stop",
        anomaly_factor=1e9,
        heartbeat_interval_s=1e-6,
        agree_interval_s=1e-6,
    )
    L.Trainer(
        default_root_dir=run,
        max_steps=30,
        callbacks=[callback],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        accelerator="cpu",
    ).fit(model)
    state = state_of(run)
    (points,) = state.metrics().values()
    healthy = [p for p in points if p.step < 12]
    assert healthy and all(set(p.metrics) >= {"loss", "lr"} for p in healthy)
    assert all(p.metrics["lr"] == pytest.approx(0.01) for p in healthy)
    (a,) = state.anomalies
    assert (a.metric, a.value, a.action) == ("loss", None, "stop")
    assert a.step is not None and 12 <= a.step <= 13  # heartbeats follow the step's end
    assert max(model.steps_run) <= a.step + 1
    assert (state.attempts[0].outcome, state.attempts[0].end_reason) == ("stopped", "anomaly")
    assert state.checkpoints == {}


def test_a_model_checkpoint_records_the_value_it_monitored_at_each_save(tmp_path: Path) -> None:
    """ModelCheckpoint(monitor="loss") saves every 4 steps: each ``checkpoint_saved`` carries
    the loss it monitored at that save, equal to what ModelCheckpoint itself kept as that
    file's score, and the dashboard's checkpoint table shows it marked as monitored."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from ckptdash.dash.feed.snapshot import SnapshotBuilder
    from ckptdash.dash.views.checkpoints import checkpoint_frame

    run = tmp_path / "run"
    kept = ModelCheckpoint(
        dirpath=run / "checkpoints", monitor="loss", every_n_train_steps=4, save_top_k=-1
    )
    L.Trainer(
        default_root_dir=run,
        max_steps=12,
        callbacks=[CkptDashCallback(run), kept],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    ).fit(Diverging(nan_at=10_000))
    state = state_of(run)
    saved = sorted(
        (c for c in state.checkpoints.values() if c.status == "saved"), key=lambda c: c.step or 0
    )
    assert [c.step for c in saved] == [4, 8, 12]
    scores = {str(Path(p).resolve()): float(v) for p, v in kept.best_k_models.items()}
    for c in saved:
        assert c.monitored is not None and set(c.monitored) == {"loss"}
        assert c.monitored["loss"] == pytest.approx(scores[str(Path(c.path).resolve())])
    snap = SnapshotBuilder(str(run)).take(
        state, sightings=0, settings=None, settings_error="", settings_key=()
    )
    rows = checkpoint_frame(snap)
    assert all("(monitored)" in m and m.startswith("loss ") for m in rows["metrics"])
