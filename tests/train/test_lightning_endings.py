"""How a Lightning attempt ends and starts, on the record: crashes, ckpt_path, early stopping.

Real Lightning on CPU, one process (the DDP and ddp_spawn cases are in
``test_lightning_launchers.py``).
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.train.helpers import fake_scontrol, slurm_env, state_of

L = pytest.importorskip("lightning.pytorch", reason="install the lightning extra: make test")
from lightning.pytorch.callbacks import (  # noqa: E402
    EarlyStopping,
    ModelCheckpoint,
    OnExceptionCheckpoint,
)

from ckptdash.errors import CheckpointChoiceError  # noqa: E402
from tests.train.test_lightning import Tiny, callback, trainer  # noqa: E402


def _saves(run: Path, every: int) -> ModelCheckpoint:
    return ModelCheckpoint(
        dirpath=run / "mc", every_n_train_steps=every, save_top_k=-1, save_last=True
    )


def test_a_fit_that_raises_records_run_failed_after_its_exception_save(tmp_path: Path) -> None:
    """fit() raising ends the attempt as failed, with the error, although Lightning never calls
    the callbacks' teardown on that path; OnExceptionCheckpoint's save is recorded before the
    end, and the run directory is usable at once by the next attempt."""
    run = tmp_path / "run"
    cb = callback(run)
    t = trainer(run, 40, [cb, OnExceptionCheckpoint(dirpath=run / "exc")])
    with pytest.raises(RuntimeError, match="boom"):
        t.fit(Tiny(raise_at=6))
    state = state_of(run)
    (attempt,) = state.attempts.values()
    assert attempt.outcome == "failed"
    assert attempt.end_reason == "RuntimeError: boom at step 6"
    (exc_save,) = [c for c in state.checkpoints.values() if c.trigger == "exception"]
    assert exc_save.status == "saved"
    assert exc_save.t is not None and attempt.ended_at is not None
    assert exc_save.t <= attempt.ended_at

    second = Tiny()
    trainer(run, 10, [callback(run)]).fit(second)  # the same callback class, a new attempt
    assert state_of(run).attempts[1].outcome == "finished"


def test_the_same_callback_fits_again_after_a_failed_fit(tmp_path: Path) -> None:
    """A callback whose fit() raised starts a fresh attempt on the next fit() (a notebook
    re-running the cell), instead of staying attached to the failed one."""
    run = tmp_path / "run"
    cb = callback(run)
    with pytest.raises(RuntimeError):
        trainer(run, 20, [cb]).fit(Tiny(raise_at=3))
    trainer(run, 20, [cb]).fit(Tiny())
    outcomes = [a.outcome for a in state_of(run).attempts.values()]
    assert outcomes == ["failed", "finished"]


def _two_saves(run: Path) -> tuple[Path, Path, Path]:
    """A first attempt saving at steps 4 and 8, and last.ckpt (step 8): returns the three."""
    trainer(run, 8, [callback(run), _saves(run, 4)]).fit(Tiny())
    mc = run / "mc"
    return mc / "epoch=0-step=4.ckpt", mc / "epoch=0-step=8.ckpt", mc / "last.ckpt"


def test_an_invalid_ckpt_path_fails_naming_the_file_and_the_newest_valid_one(
    tmp_path: Path,
) -> None:
    """fit(ckpt_path=<a truncated checkpoint>) fails before loading with an error that names
    the file, why it is invalid and the newest valid checkpoint to use instead; the refusal
    is an event and the attempt ends as failed."""
    run = tmp_path / "run"
    _, newest, last = _two_saves(run)
    last.write_bytes(last.read_bytes()[:100])
    with pytest.raises(CheckpointChoiceError) as err:
        trainer(run, 12, [callback(run)]).fit(Tiny(), ckpt_path=str(last))
    message = str(err.value)
    assert str(last) in message and "truncated" in message
    assert str(newest) in message
    state = state_of(run)
    assert state.checkpoints[str(last)].status == "invalid"
    assert state.attempts[1].outcome == "failed"


def test_ckpt_path_last_that_is_truncated_is_refused_too(tmp_path: Path) -> None:
    """fit(ckpt_path="last") resolves to Lightning's last.ckpt; when ckptdash recorded it and it
    no longer matches, the same clear error comes instead of a crash inside torch.load."""
    run = tmp_path / "run"
    *_, last = _two_saves(run)
    last.write_bytes(last.read_bytes()[:100])
    with pytest.raises(CheckpointChoiceError, match="newest valid"):
        trainer(run, 12, [callback(run), _saves(run, 4)]).fit(Tiny(), ckpt_path="last")


def test_an_older_valid_ckpt_path_is_loaded_and_the_event_names_the_newer(
    tmp_path: Path,
) -> None:
    """The user's explicit choice is respected: an older valid checkpoint is loaded, and the
    run_resumed event says which newer valid checkpoint exists, with the step it resumed at."""
    run = tmp_path / "run"
    older, newest, _ = _two_saves(run)
    assert newest.exists()
    second = Tiny()
    trainer(run, 12, [callback(run)]).fit(second, ckpt_path=str(older))
    assert second.steps_run[0] == 4
    attempt = state_of(run).attempts[1]
    assert attempt.resumed_from == str(older)
    assert "given to fit(ckpt_path=...)" in attempt.resume_reason
    assert "newer" in attempt.resume_reason and "(step 8)" in attempt.resume_reason


def test_run_resumed_says_the_step_it_resumed_at(tmp_path: Path) -> None:
    """Lightning's run_resumed carries the step of the loaded checkpoint (was None)."""
    run = tmp_path / "run"
    _two_saves(run)
    trainer(run, 12, [callback(run)]).fit(Tiny())
    events = [e for e in _events(run) if e["kind"] == "run_resumed"]
    assert [e["step"] for e in events] == [8]


def test_ckpt_path_last_that_lightning_does_not_find_loads_nothing(tmp_path: Path) -> None:
    """With a versioned logger folder, fit(ckpt_path="last") in a new version finds no last
    checkpoint and Lightning starts from scratch; ckptdash does not load the old version's
    last.ckpt behind its back."""
    from lightning.pytorch.loggers import CSVLogger

    run = tmp_path / "run"

    def versioned(steps: int) -> Any:
        return L.Trainer(
            default_root_dir=run,
            max_steps=steps,
            # A new version folder per attempt, as Lightning makes them when ckptdash leaves the
            # loggers alone (continuing them would put every attempt in one folder).
            callbacks=[
                callback(run, continue_loggers=False),
                ModelCheckpoint(every_n_train_steps=4, save_last=True),
            ],
            logger=CSVLogger(run, name="logs"),  # checkpoints under logs/version_N/checkpoints
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
        )

    versioned(8).fit(Tiny())
    assert (run / "logs" / "version_0" / "checkpoints" / "last.ckpt").exists()
    second = Tiny()
    with pytest.warns(UserWarning, match="no last checkpoint available"):
        versioned(6).fit(second, ckpt_path="last")
    assert second.steps_run[0] == 0
    assert state_of(run).attempts[1].resumed_from is None


def test_early_stopping_says_why_the_run_ended(tmp_path: Path) -> None:
    """An EarlyStopping end is a completed run whose recorded reason names early stopping and
    Lightning's own message, instead of a bare "completed"."""

    class Flat(Tiny):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val", torch.tensor(1.0))  # never improves

        def val_dataloader(self) -> Any:
            return self.train_dataloader()

    run = tmp_path / "run"
    stopper = EarlyStopping("val", patience=1)
    t = L.Trainer(
        default_root_dir=run,
        max_epochs=20,
        limit_train_batches=2,
        limit_val_batches=1,
        callbacks=[callback(run), stopper],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        accelerator="cpu",
    )
    t.fit(Flat())
    assert t.current_epoch < 19
    (attempt,) = state_of(run).attempts.values()
    assert attempt.outcome == "finished"
    assert "early stopping" in attempt.end_reason
    assert "val" in attempt.end_reason


def test_a_copied_run_directory_resumes_from_its_own_files(tmp_path: Path) -> None:
    """`cp -r run copy` keeps the original's absolute paths in the log: the copy's next
    attempt resumes from the copy's own checkpoint (not the original's) and says it is a copy."""
    run, copy = tmp_path / "run", tmp_path / "copy"
    trainer(run, 8, [callback(run), _saves(run, 4)]).fit(Tiny())
    shutil.copytree(run, copy)
    trainer(copy, 10, [callback(copy)]).fit(Tiny())
    attempt = state_of(copy).attempts[1]
    assert attempt.resumed_from is not None
    assert Path(attempt.resumed_from).is_relative_to(copy)
    assert "copy of" in attempt.resume_reason and str(run) in attempt.resume_reason
    assert len(state_of(run).attempts) == 1  # the original's log is untouched


def _events(run: Path) -> list[dict[str, Any]]:
    import json

    out = []
    for f in sorted((run / "events").iterdir()):
        out += [json.loads(line) for line in f.read_text().splitlines() if line]
    return out


def _lightning_sees_slurm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, restart: int) -> Path:
    """A SLURM batch job as Lightning detects it (SLURM_NTASKS set): its auto-requeue is on."""
    log = tmp_path / "scontrol.log"
    fake_scontrol(tmp_path / "bin", log)
    slurm_env(monkeypatch, tmp_path / "bin", restart=restart)
    for name, value in {"SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SLURM_NODEID", "0")
    monkeypatch.setenv("SLURM_NODELIST", "localhost")
    return log


def test_lightning_auto_requeue_signal_is_ckptdash_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """With Lightning's SLURM auto-requeue left on, its USR1 is recorded as a signal, saved at
    the step boundary with trigger `signal` (no mid-step hpc_ckpt_N), requeued once by ckptdash;
    at start a line says what each signal will do."""
    log = _lightning_sees_slurm(monkeypatch, tmp_path, restart=0)

    class Usr1(Tiny):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if self.trainer.global_step == 5:
                os.kill(os.getpid(), signal.SIGUSR1)
            return super().training_step(batch, batch_idx)

    run = tmp_path / "run"
    t = trainer(run, 40, [callback(run)])
    t.fit(Usr1())
    assert t.global_step == 6
    state = state_of(run)
    assert [(s.signal, s.action) for s in state.signals] == [("SIGUSR1", "requeue")]
    (saved,) = [c for c in state.checkpoints.values() if c.trigger != "periodic"]
    assert saved.trigger == "signal" and saved.step == 6
    assert not list(run.glob("hpc_ckpt_*"))
    assert [r.issued for r in state.requeues] == [True]
    assert log.read_text().split() == ["requeue", "4242"]
    line = next(x for x in capfd.readouterr().err.splitlines() if x.startswith("ckptdash: "))
    assert "SIGUSR1 -> save at the next step boundary, requeue by ckptdash" in line
    assert "(replaces Lightning's handler)" in line


def test_lightning_auto_requeue_signal_respects_the_requeue_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightning's USR1 on the last attempt the budget allows: saved, not requeued, and the
    requeue_skipped event says the budget was reached."""
    log = _lightning_sees_slurm(monkeypatch, tmp_path, restart=1)

    class Usr1(Tiny):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if self.trainer.global_step == 3:
                os.kill(os.getpid(), signal.SIGUSR1)
            return super().training_step(batch, batch_idx)

    run = tmp_path / "run"
    trainer(run, 40, [callback(run, max_attempts=2)]).fit(Usr1())
    (skipped,) = state_of(run).requeues
    assert not skipped.issued and "budget" in skipped.reason
    assert not log.exists()


def test_start_up_line_warns_when_nobody_handles_slurm_s_usr1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """In a SLURM job that Lightning does not recognise (no --ntasks), the start-up line says
    that USR1 would end the process unsaved, and how to map it."""
    fake_scontrol(tmp_path / "bin", tmp_path / "scontrol.log")
    slurm_env(monkeypatch, tmp_path / "bin")
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    run = tmp_path / "run"
    trainer(run, 2, [callback(run)]).fit(Tiny())
    line = next(x for x in capfd.readouterr().err.splitlines() if x.startswith("ckptdash: "))
    assert "SIGUSR2 -> save at the next step boundary, requeue by ckptdash" in line
    assert "SIGUSR1 -> nobody handles it" in line


def test_ctrl_c_in_fit_is_recorded_as_interrupted(tmp_path: Path) -> None:
    """A KeyboardInterrupt in fit() (Lightning then exits the process) ends the attempt on the
    record as stopped, "interrupted" — as with Monitor — not left running."""

    class CtrlC(Tiny):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if self.trainer.global_step == 3:
                raise KeyboardInterrupt
            return super().training_step(batch, batch_idx)

    run = tmp_path / "run"
    sigint = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit):  # Lightning's graceful shutdown ends with sys.exit(1)
            trainer(run, 20, [callback(run)]).fit(CtrlC())
    finally:
        signal.signal(signal.SIGINT, sigint)  # Lightning ignores Ctrl+C from then on
    (attempt,) = state_of(run).attempts.values()
    assert (attempt.outcome, attempt.end_reason) == ("stopped", "interrupted")


def test_lightning_s_usr1_during_the_sanity_check_is_ckptdash_s_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """USR1 during the sanity-check validation (Lightning's handlers are registered by then)
    is taken at the first step boundary: a signal save, no hpc_ckpt_N."""
    _lightning_sees_slurm(monkeypatch, tmp_path, restart=0)

    class Validated(Tiny):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            if self.trainer.sanity_checking and batch_idx == 0:
                os.kill(os.getpid(), signal.SIGUSR1)

        def val_dataloader(self) -> Any:
            return self.train_dataloader()

    run = tmp_path / "run"
    t = trainer(run, 40, [callback(run)], enable_checkpointing=False, limit_val_batches=1)
    t.fit(Validated())
    assert t.global_step == 1
    (saved,) = state_of(run).checkpoints.values()
    assert saved.trigger == "signal"
    assert not list(run.glob("hpc_ckpt_*"))
