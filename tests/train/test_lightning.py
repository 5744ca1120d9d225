"""The Lightning callback on real CPU training: every save path, signals, requeue, resume."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from ckptdash import control
from tests.train.helpers import fake_scontrol, slurm_env, state_of

L = pytest.importorskip("lightning.pytorch", reason="install the lightning extra: make test")
from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint  # noqa: E402

from ckptdash.lightning import CkptDashCallback  # noqa: E402


class Tiny(L.LightningModule):  # type: ignore[misc,name-defined]
    """A linear model on random data; optionally signals itself or raises at a given step."""

    def __init__(self, signal_at: int | None = None, raise_at: int | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.signal_at, self.raise_at = signal_at, raise_at
        self.steps_run: list[int] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        step = self.trainer.global_step
        self.steps_run.append(step)
        if step == self.signal_at:
            os.kill(os.getpid(), signal.SIGUSR2)
        if step == self.raise_at:
            raise RuntimeError(f"boom at step {step}")
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("loss", loss)
        return loss

    def train_dataloader(self) -> Any:
        data = torch.utils.data.TensorDataset(torch.randn(64, 4))
        return torch.utils.data.DataLoader(data, batch_size=4)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def trainer(run: Path, max_steps: int, callbacks: list[Any], **kw: Any) -> Any:
    return L.Trainer(
        default_root_dir=run,
        max_steps=max_steps,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        **kw,
    )


def callback(run: Path, **kw: Any) -> CkptDashCallback:
    kw.setdefault("agree_interval_s", 0.001)
    kw.setdefault("poll_interval_s", 0.001)
    return CkptDashCallback(run, **kw)


def test_every_save_path_is_recorded_with_its_trigger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ModelCheckpoint → periodic, trainer.save_checkpoint → api, OnExceptionCheckpoint →
    exception, a signal → signal; each with size, checksum and a durable event."""
    run, log = tmp_path / "run", tmp_path / "scontrol.log"
    fake_scontrol(tmp_path / "bin", log)
    slurm_env(monkeypatch, tmp_path / "bin")
    mc = ModelCheckpoint(dirpath=run / "mc", every_n_train_steps=4, save_top_k=-1)
    t = trainer(run, 40, [callback(run), mc])
    t.fit(Tiny(signal_at=10))
    assert t.global_step == 11  # stopped right after the signal save
    t.save_checkpoint(run / "manual-by-user.ckpt")

    t2 = trainer(run, 40, [callback(run), OnExceptionCheckpoint(dirpath=run / "exc")])
    with pytest.raises(RuntimeError, match="boom"):
        t2.fit(Tiny(raise_at=14))

    state = state_of(run)
    triggers = {c.trigger for c in state.checkpoints.values()}
    assert triggers == {"periodic", "api", "signal", "exception"}
    for c in state.checkpoints.values():
        assert c.status == "saved"
        assert c.size_bytes == Path(c.path).stat().st_size
        assert c.checksum.startswith("xxh3_128:")
    (sig,) = [c for c in state.checkpoints.values() if c.trigger == "signal"]
    assert sig.step == 11
    assert torch.load(sig.path, weights_only=False)["ckptdash"]["trigger"] == "signal"
    assert log.read_text().split() == ["requeue", "4242"]
    assert state.event_counts.get("exception") == 1


def test_signal_then_resume_continues_at_next_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a signal save and requeue, the next attempt (no ckpt_path given) resumes from that
    checkpoint and runs exactly the remaining steps: none redone, none skipped."""
    run = tmp_path / "run"
    fake_scontrol(tmp_path / "bin", tmp_path / "log")
    slurm_env(monkeypatch, tmp_path / "bin", restart=0)
    first = Tiny(signal_at=7)
    trainer(run, 20, [callback(run)]).fit(first)
    assert first.steps_run == list(range(8))

    slurm_env(monkeypatch, tmp_path / "bin", restart=1)
    second = Tiny()
    t = trainer(run, 20, [callback(run)])
    t.fit(second)
    assert second.steps_run == list(range(8, 20))
    assert t.global_step == 20
    state = state_of(run)
    resumed = state.attempts[1].resumed_from
    assert resumed is not None
    assert state.checkpoints[resumed].step == 8  # the signal save, or the epoch-end save with it


def test_newer_periodic_beats_older_hpc_and_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightning's hpc precedence does not apply: the newest valid checkpoint by step wins,
    a stray file with ckpt in its name breaks nothing, and a truncated newest one is skipped."""
    run = tmp_path / "run"
    fake_scontrol(tmp_path / "bin", tmp_path / "log")

    def mc() -> ModelCheckpoint:
        return ModelCheckpoint(dirpath=run / "mc", every_n_train_steps=5, save_top_k=-1)

    slurm_env(monkeypatch, tmp_path / "bin", restart=0)
    trainer(run, 12, [callback(run), mc()]).fit(Tiny(signal_at=3))
    slurm_env(monkeypatch, tmp_path / "bin", restart=1)
    trainer(run, 12, [callback(run), mc()]).fit(Tiny())  # resumes at 4; periodic at 5 and 10
    (run / "notes_ckpt_old.txt").write_text("a stray file")
    signal_ckpt = next((run / "checkpoints").glob("*signal*"))
    (run / "hpc_ckpt_1.ckpt").write_bytes(signal_ckpt.read_bytes())  # Lightning would pick this
    newest = run / "mc" / "epoch=0-step=10.ckpt"
    newest.write_bytes(newest.read_bytes()[:64])  # torn by a crash
    slurm_env(monkeypatch, tmp_path / "bin", restart=2)
    third = Tiny()
    trainer(run, 14, [callback(run)]).fit(third)
    state = state_of(run)
    resumed = state.attempts[2].resumed_from
    assert resumed is not None
    assert "step=5" in resumed  # the older periodic one; the truncated step=10 was skipped
    assert third.steps_run[0] == 5
    assert any(c.status == "invalid" for c in state.checkpoints.values())


def test_commands_through_lightning(tmp_path: Path) -> None:
    """Save now gives one manual save answered with its path; Stop after save ends fit()."""
    run = tmp_path / "run"
    cb = callback(run)
    ids: list[str] = []

    class Commanding(Tiny):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if self.trainer.global_step == 2:
                ids.append(control.issue(run, "save_now").id)
            if self.trainer.global_step == 9:
                ids.append(control.issue(run, "stop_after_save").id)
            return super().training_step(batch, batch_idx)

    t = trainer(run, 200, [cb])
    t.fit(Commanding())
    assert t.global_step == 10
    state = state_of(run)
    assert [state.commands[i].status for i in ids] == ["applied", "applied"]
    manual = {c.path for c in state.checkpoints.values() if c.trigger == "manual"}
    assert {state.commands[i].detail for i in ids} == manual
    assert len(manual) == 2


def test_async_checkpoint_io_is_recorded_when_written(tmp_path: Path) -> None:
    """With AsyncCheckpointIO the saved event comes after the file is complete on disk."""
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    run = tmp_path / "run"
    seen: list[tuple[str, int]] = []
    cb = callback(
        run, on_checkpoint_saved=lambda e: seen.append((e.path, Path(e.path).stat().st_size))
    )
    mc = ModelCheckpoint(dirpath=run / "mc", every_n_train_steps=3, save_top_k=-1)
    t = trainer(run, 9, [cb, mc], plugins=[AsyncCheckpointIO()])
    t.fit(Tiny())
    assert len(seen) == 3
    state = state_of(run)
    for path, size in seen:
        assert state.checkpoints[path].size_bytes == size
        assert state.checkpoints[path].trigger == "periodic"


def test_async_signal_save_is_durable_before_the_requeue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With AsyncCheckpointIO a signal save is written and recorded before `scontrol requeue`
    runs: on SLURM the requeue's SIGTERM follows within milliseconds, so a save still queued
    then would be lost (and the next attempt would resume from an older checkpoint)."""
    import threading

    from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

    class SlowIO(TorchCheckpointIO):  # type: ignore[misc]
        def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
            threading.Event().wait(0.3)
            super().save_checkpoint(*args, **kwargs)

    run = tmp_path / "run"
    fake_scontrol(tmp_path / "bin", tmp_path / "log")
    slurm_env(monkeypatch, tmp_path / "bin")
    t = trainer(run, 40, [callback(run)], plugins=[AsyncCheckpointIO(SlowIO())])
    t.fit(Tiny(signal_at=5))
    state = state_of(run)
    (saved,) = [c for c in state.checkpoints.values() if c.trigger == "signal"]
    (requeue,) = state.requeues
    assert requeue.issued
    assert saved.t is not None
    assert saved.t < requeue.t


def test_signal_stop_is_recorded_before_lightning_restores_sigterm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a signal save and requeue, run_finished is durable before Lightning's teardown
    puts back the default SIGTERM action: SLURM's SIGTERM right after the requeue can end the
    process from then on, but the attempt is already recorded as stopped (preempted)."""
    run = tmp_path / "run"
    fake_scontrol(tmp_path / "bin", tmp_path / "log")
    slurm_env(monkeypatch, tmp_path / "bin")
    seen: list[tuple[object, list[str]]] = []

    class Probe(L.Callback):  # type: ignore[misc,name-defined]
        def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
            # Lightning's _teardown() (which restores SIGTERM) has run by now.
            outcomes = [a.outcome for a in state_of(run).attempts.values()]
            seen.append((signal.getsignal(signal.SIGTERM), outcomes))

    trainer(run, 40, [callback(run), Probe()]).fit(Tiny(signal_at=5))
    ((handler, outcomes),) = seen
    assert handler is signal.SIG_DFL
    assert outcomes == ["stopped"]


def test_unused_batch_hooks_are_skipped_but_a_subclass_override_still_runs(
    tmp_path: Path,
) -> None:
    """Lightning skips the per-batch hooks ckptdash does not use (that is what keeps its step
    overhead near zero), while a subclass that overrides one of them is still called."""

    class Counting(CkptDashCallback):
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            self.backward_calls = 0

        def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
            self.backward_calls += 1

    plain = callback(tmp_path / "a")
    assert plain.on_before_backward is None and plain.on_train_batch_start is None
    counting = Counting(tmp_path / "b", agree_interval_s=0.001, poll_interval_s=0.001)
    t = trainer(tmp_path / "b", 6, [counting])
    t.fit(Tiny())
    assert counting.backward_calls == 6
    assert state_of(tmp_path / "b").event_counts.get("heartbeat", 0) >= 1


def test_one_process_checks_once_a_period_and_right_after_a_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A single-process fit looks at signals, commands and heartbeats at its first step, then
    once a period (here 30 s, longer than the fit) and at the step a signal came in, not at
    every step: between checks its per-step hook is off and Lightning does not dispatch it."""
    from ckptdash.train.engine.session import Session

    checks: list[int] = []
    check_now = Session.check_now

    def counting(self: Session, step: int, *args: Any, **kw: Any) -> Any:
        checks.append(step)
        return check_now(self, step, *args, **kw)

    monkeypatch.setattr(Session, "check_now", counting)
    fake_scontrol(tmp_path / "bin", tmp_path / "log")
    slurm_env(monkeypatch, tmp_path / "bin")
    run = tmp_path / "run"
    cb = CkptDashCallback(
        run, agree_interval_s=30.0, poll_interval_s=30.0, heartbeat_interval_s=30.0
    )
    t = trainer(run, 40, [cb])
    t.fit(Tiny(signal_at=20))
    # Step 20's training_step got the signal; the check at the end of that step saved it.
    assert checks == [1, 21]
    assert t.global_step == 21
    state = state_of(run)
    assert [c.step for c in state.checkpoints.values() if c.trigger == "signal"] == [21]
    assert state.event_counts.get("heartbeat", 0) >= 1  # from the first check
    assert cb.on_train_batch_end == cb.__class__.on_train_batch_end.__get__(cb)  # restored
