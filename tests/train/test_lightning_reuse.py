"""Lightning on a run directory used before: another framework's checkpoint, a changed model,
and a fresh start that lasts (issue 23, point 3), with real Lightning training on CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import ckptdash
from ckptdash import control
from ckptdash.analysis import health
from ckptdash.control.settings import CRASH_LOOP_AUTHOR
from ckptdash.errors import CheckpointMismatchError
from tests.train.helpers import state_of

L = pytest.importorskip("lightning.pytorch", reason="install the lightning extra: make test")

from ckptdash.lightning import CkptDashCallback  # noqa: E402


class Wide(L.LightningModule):  # type: ignore[misc,name-defined]
    """A linear model of a chosen width on random data."""

    def __init__(self, width: int = 1) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, width)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def train_dataloader(self) -> Any:
        data = torch.utils.data.TensorDataset(torch.randn(64, 4))
        return torch.utils.data.DataLoader(data, batch_size=4)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(run: Path, width: int, max_steps: int, **options: Any) -> Any:
    trainer = L.Trainer(
        default_root_dir=run,
        max_steps=max_steps,
        callbacks=[CkptDashCallback(run, pulse_interval_s=0, **options)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        accelerator="cpu",
    )
    trainer.fit(Wide(width))
    trainer.save_checkpoint(run / "checkpoints" / f"lightning-{max_steps}.ckpt")
    return trainer


def test_a_plain_pytorch_checkpoint_fed_to_lightning_fails_in_one_line(tmp_path: Path) -> None:
    """A run directory where a plain-PyTorch loop saved ``step=300.ckpt``: Lightning's fit()
    fails with one line naming that file, why (not a Lightning checkpoint) and the fix, and
    the attempt's ``run_failed`` says the same line."""
    run = tmp_path / "run"
    with ckptdash.Monitor(run, max_steps=301, pulse_interval_s=0) as monitor:
        monitor.step(300)
        monitor.save({"model": torch.nn.Linear(4, 1).state_dict(), "step": 300})
    with pytest.raises(CheckpointMismatchError) as info:
        fit(run, width=1, max_steps=5)
    message = str(info.value)
    assert message.startswith("checkpoints/step=300.ckpt does not fit this model (KeyError")
    assert "not a Lightning checkpoint" in message and f"ckptdash resume {run} --fresh" in message
    assert "\n" not in message
    failed = state_of(run).attempts[1]
    assert failed.outcome == "failed" and message in failed.end_reason


def test_a_changed_lightning_model_fails_in_one_line_and_fresh_lasts(tmp_path: Path) -> None:
    """The model grew: the old checkpoint fails fit() with one line (size mismatch, the file,
    the fix); the second same failure is a crash loop (health's alert, requeue suspended by
    ckptdash) — under Lightning as in a plain loop; ``fresh="v2"`` starts fresh once, and
    the next fit with it resumes from v2's own checkpoint, never the old model's."""
    run = tmp_path / "run"
    fit(run, width=1, max_steps=8)  # saves lightning-8.ckpt, step 8
    for _ in range(2):  # the job requeued: the same start, the same failure
        with pytest.raises(
            CheckpointMismatchError, match=r"lightning-8\.ckpt does not fit"
        ) as info:
            fit(run, width=2, max_steps=12)
        assert "size mismatch for layer.weight: checkpoint [1, 4], model [2, 4]" in str(info.value)
    state = state_of(run)
    assert [a.outcome for a in state.attempts.values()] == ["finished", "failed", "failed"]
    alert = health.crash_loop(state)
    assert alert is not None and "attempts 1-2 failed the same way" in alert.detail
    assert any("crash loop" in r.reason and not r.issued for r in state.requeues)
    settings = control.read_settings(run)
    assert settings.requeue_suspended and settings.updated_by == CRASH_LOOP_AUTHOR
    fit(run, width=2, max_steps=4, fresh="v2")  # fresh: saves lightning-4.ckpt
    trainer = fit(run, width=2, max_steps=6, fresh="v2")
    state = state_of(run)
    newest = state.attempts[max(state.attempts)]
    assert newest.resumed_from is not None and newest.resumed_from.endswith("lightning-4.ckpt")
    assert trainer.global_step == 6
