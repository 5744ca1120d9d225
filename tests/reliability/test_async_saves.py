"""Background saves under real faults: kill -9 while a persist runs, a disk that fills up.

The same guarantees as synchronous saves (tests/reliability/test_kills.py and
test_disk_faults.py), for ``Monitor.save_async``: a checkpoint exists only once its
persist is durable and recorded, and a failure in the background reaches the caller.
"""

from __future__ import annotations

import errno
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from ckptdash import Monitor, resume_path
from ckptdash.errors import AtomicWriteError
from ckptdash.events import CheckpointFailed, CheckpointSaved
from tests.reliability import faults
from tests.reliability.conftest import scale


def test_kill_9_during_background_persists_leaves_the_previous_checkpoint_the_resume_choice(
    tmp_path: Path, figures: Callable[[str, str], None]
) -> None:
    """A job saving 50 MB checkpoints with save_async (changing its tensors right after each
    call) is SIGKILLed at random moments, 10 times (60 long), most while a persist runs in
    the background. After every kill every recorded checkpoint still validates, the resume
    rule names the newest one that really does — the previous checkpoint when the kill cut a
    persist short — and it loads holding the step it was saved at (the snapshot, not the
    values the job wrote after the call); temp files are cleaned up by the next attempt."""
    seed = faults.seed_from_env()
    kills = scale(10, 60)
    report = faults.kill_during_saves(
        tmp_path, kills=kills, seed=seed, log=print, async_save=True, max_delay_s=1.5
    )
    figures("kill -9 during background persists", report.summary())
    assert report.problems == [], f"seed {seed}:\n" + "\n".join(report.problems)
    assert report.kills == kills
    assert report.in_save >= kills // 2, "most kills should land inside a persist"
    # Whether a resume choice was right after each kill is in report.problems; this only
    # says the test did load resumes. Kills before the first save is durable have nothing
    # to load, and on a loaded machine more than one can land there.
    assert report.resumes_loaded >= kills // 2, "most kills should find one to resume"


def test_disk_full_in_the_background_surfaces_in_result_and_as_checkpoint_failed(
    small_disk: Any,
) -> None:
    """On a 2 MiB disk a background save of 8 MiB fails with ENOSPC: ``result()`` raises the
    AtomicWriteError, ``checkpoint_failed`` names the cause, no temp file is left, the earlier
    checkpoint stays the resume choice. A failure nobody retrieved is a warning when the
    monitor closes, and the next save that fits succeeds."""
    disk = small_disk(2048)
    run = disk / "run"
    monitor = Monitor(run, install_signals=False)
    folder = monitor.config.checkpoint_path
    monitor.step(1)
    first = monitor.save_async({"w": torch.zeros(1 << 16), "step": 1}).result()
    assert first is not None

    monitor.step(2)
    handle = monitor.save_async({"w": torch.zeros(2 << 20), "step": 2})
    with pytest.raises(AtomicWriteError) as full:
        handle.result(timeout=60)
    assert full.value.errno == errno.ENOSPC
    assert handle.done() and isinstance(handle.error, AtomicWriteError)

    monitor.step(3)
    unseen = monitor.save_async({"w": torch.zeros(2 << 20), "step": 3})
    unseen.wait(60)

    replay = faults.Replay.of(run)
    assert [
        (f.step, "No space left on device" in f.error) for f in replay.of_kind(CheckpointFailed)
    ] == [(2, True), (3, True)]
    assert sorted(os.listdir(folder)) == ["step=1.ckpt"] and not faults.temp_files(folder)
    assert resume_path(run) == first.path

    monitor.step(4)
    fits = monitor.save_async({"w": torch.zeros(1 << 16), "step": 4})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor.close()
    assert fits.done() and fits.error is None
    assert [str(w.message) for w in caught if "step=3.ckpt" in str(w.message)]
    saved = faults.Replay.of(run).of_kind(CheckpointSaved)
    assert [s.step for s in saved] == [1, 4] and all(s.blocking_s is not None for s in saved)
    assert resume_path(run) == str(folder / "step=4.ckpt")


def test_lightning_background_save_on_a_full_disk_ends_fit_at_the_next_save(
    small_disk: Any,
) -> None:
    """CkptDashCallback(async_save=True) with ModelCheckpoint writing to a 128 KiB disk: the
    first 256 KiB checkpoint fails in the background (checkpoint_failed, ENOSPC, no temp file
    left) and the next save raises that error out of fit(), as Lightning's own
    AsyncCheckpointIO does, and the exception is recorded."""
    lightning = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.callbacks import ModelCheckpoint

    from ckptdash.lightning import CkptDashCallback
    from tests.train.test_lightning import trainer

    class Wide(lightning.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(256, 256)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.layer(batch[0]).pow(2).mean()  # type: ignore[no-any-return]

        def train_dataloader(self) -> Any:
            data = torch.utils.data.TensorDataset(torch.randn(64, 256))
            return torch.utils.data.DataLoader(data, batch_size=4)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    disk = small_disk(128)
    run = disk.parent / "run"
    cb = CkptDashCallback(run, async_save=True)
    mc = ModelCheckpoint(dirpath=disk, every_n_train_steps=2, save_top_k=-1)
    with pytest.raises(AtomicWriteError) as full:
        trainer(run, 12, [cb, mc]).fit(Wide())
    assert full.value.errno == errno.ENOSPC
    replay = faults.Replay.of(run)
    (failed,) = replay.of_kind(CheckpointFailed)
    assert failed.step == 2 and "No space left on device" in failed.error
    assert not replay.of_kind(CheckpointSaved) and not faults.temp_files(disk)
    (exception,) = replay.state.exceptions
    assert exception.error_type == "AtomicWriteError"
