"""The Lightning callback declares the folders it saves in, so its checkpoints outside the
run directory count and a forged record beside them does not (issue 11, finding 7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptdash.rundir import RunDir
from ckptdash.state.reading import load_state
from tests.security.test_rundir_records import _forge
from tests.train.test_lightning import Tiny, callback, trainer

L = pytest.importorskip("lightning.pytorch", reason="install the lightning extra: make test")
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402


def test_model_checkpoint_folder_outside_the_run_is_declared_and_resumed_from(
    tmp_path: Path,
) -> None:
    """ModelCheckpoint saving to a folder outside the run directory: the callback declares
    that folder (once per attempt), its saves are valid and the next fit resumes from the
    newest; a forged record of a file next to the run directory stays invalid."""
    run, outside = tmp_path / "run", tmp_path / "scratch" / "mc"
    mc = ModelCheckpoint(dirpath=outside, every_n_train_steps=2, save_top_k=-1)
    trainer(run, 4, [callback(run), mc]).fit(Tiny())
    stray = tmp_path / "stray.ckpt"
    stray.write_bytes((outside / "epoch=0-step=4.ckpt").read_bytes())
    _forge(run, "A0000.R0000.evil.1.jsonl", stray, step=99, run_id=RunDir(run).info().run_id)

    mc2 = ModelCheckpoint(dirpath=outside, every_n_train_steps=2, save_top_k=-1)
    trainer(run, 6, [callback(run), mc2]).fit(Tiny())
    state = load_state(run)
    assert str(outside) in state.checkpoint_dirs
    assert state.checkpoints[str(stray)].status == "invalid"
    assert state.attempts[1].resumed_from == str(outside / "epoch=0-step=4.ckpt")
    assert {c.step for c in state.valid_checkpoints()} == {2, 4, 6}
