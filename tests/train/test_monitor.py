"""Plain-PyTorch loops with Monitor: signals, requeue policy, commands and the resume rule."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import pytest

import ckptdash
from ckptdash import control
from tests.train.helpers import (
    fake_scontrol,
    loop_state,
    send_self,
    slurm_env,
    state_of,
    train_loop,
)


def test_signal_saves_at_next_boundary_requeues_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGUSR2 mid-run → signal save at that step, scontrol requeue, stop; the next attempt
    resumes from it at the next step and finishes, with no step redone or skipped."""
    run, log = tmp_path / "run", tmp_path / "scontrol.log"
    fake_scontrol(tmp_path / "bin", log)
    slurm_env(monkeypatch, tmp_path / "bin", restart=0)

    start, last = train_loop(run, total_steps=30, on_step=lambda s: s == 9 and send_self())
    assert (start, last) == (0, 9)
    assert log.read_text().split() == ["requeue", "4242"]

    slurm_env(monkeypatch, tmp_path / "bin", restart=1)
    start, last = train_loop(run, total_steps=30)
    assert (start, last) == (10, 29)

    state = state_of(run)
    (ckpt,) = [c for c in state.checkpoints.values() if c.trigger == "signal"]
    assert ckpt.step == 9
    assert [s.signal for s in state.signals] == ["SIGUSR2"]
    assert [(r.issued, r.attempt) for r in state.requeues] == [(True, 0)]
    assert (state.attempts[0].outcome, state.attempts[0].end_reason) == ("stopped", "preempted")
    assert state.attempts[1].outcome == "finished"
    assert state.attempts[1].resumed_from == ckpt.path


def test_a_new_job_in_a_used_run_dir_numbers_its_attempts_after_the_earlier_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resubmitting into the same run directory (a new job id, SLURM_RESTART_COUNT back at 0)
    gives new attempt numbers instead of merging with the first job's attempts; the new job
    resumes where the first ended, and its requeue budget counts its own restarts only."""
    run, log = tmp_path / "run", tmp_path / "scontrol.log"
    fake_scontrol(tmp_path / "bin", log)
    slurm_env(monkeypatch, tmp_path / "bin", job_id="100", restart=0)
    assert train_loop(run, total_steps=30, on_step=lambda s: s == 4 and send_self()) == (0, 4)
    slurm_env(monkeypatch, tmp_path / "bin", job_id="100", restart=1)
    assert train_loop(run, total_steps=30, on_step=lambda s: s == 9 and send_self()) == (5, 9)

    slurm_env(monkeypatch, tmp_path / "bin", job_id="200", restart=0)
    assert train_loop(
        run, total_steps=30, max_attempts=2, on_step=lambda s: s == 14 and send_self()
    ) == (10, 14)
    slurm_env(monkeypatch, tmp_path / "bin", job_id="200", restart=1)
    assert train_loop(run, total_steps=30) == (15, 29)

    state = state_of(run)
    jobs = {n: (a.job_id, a.outcome) for n, a in state.attempts.items()}
    assert jobs == {
        0: ("100", "stopped"),
        1: ("100", "stopped"),
        2: ("200", "stopped"),
        3: ("200", "finished"),
    }
    # Job 200's first attempt was within its budget of 2: it requeued itself.
    assert log.read_text().split() == ["requeue", "100", "requeue", "100", "requeue", "200"]


def test_suspended_requeue_saves_but_does_not_requeue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Suspending requeue in the settings just before the signal still saves, never requeues,
    and the skip says it was suspended."""
    run, log = tmp_path / "run", tmp_path / "scontrol.log"
    fake_scontrol(tmp_path / "bin", log)
    slurm_env(monkeypatch, tmp_path / "bin")

    def suspend_then_signal(step: int) -> None:
        if step == 5:
            control.update_settings(run, requeue_suspended=True, author="ana")
            send_self()

    train_loop(run, total_steps=20, on_step=suspend_then_signal)
    assert not log.exists()
    state = state_of(run)
    assert [c.trigger for c in state.checkpoints.values()] == ["signal"]
    (skip,) = state.requeues
    assert not skip.issued
    assert "suspended" in skip.reason


def test_requeue_budget_stops_the_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At the last allowed attempt a preemption saves and ends without requeue, saying why."""
    run, log = tmp_path / "run", tmp_path / "scontrol.log"
    fake_scontrol(tmp_path / "bin", log)
    slurm_env(monkeypatch, tmp_path / "bin", restart=2)
    train_loop(run, total_steps=20, max_attempts=3, on_step=lambda s: s == 3 and send_self())
    assert not log.exists()
    (skip,) = state_of(run).requeues
    assert "budget" in skip.reason
    assert "attempt 3 of 3" in skip.reason


def test_failed_requeue_command_is_an_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A requeue command that fails is recorded with its exit status and output."""
    run = tmp_path / "run"
    fake_scontrol(tmp_path / "bin", tmp_path / "log", exit_code=1)
    slurm_env(monkeypatch, tmp_path / "bin")
    train_loop(run, total_steps=20, on_step=lambda s: s == 2 and send_self())
    (skip,) = state_of(run).requeues
    assert "exit 1" in skip.reason
    assert "requeue refused" in skip.reason


def test_requeue_command_survives_the_sigterm_its_requeue_causes() -> None:
    """On SLURM a requeue sends SIGTERM to every process of the job, the still-running
    `scontrol requeue` included: the command runs with SIGTERM ignored, so a requeue that
    worked is not reported as failed (exit -15, seen on a real cluster)."""
    import sys

    from ckptdash.schedulers.base import run_command

    code = "import os, signal; os.kill(os.getpid(), signal.SIGTERM); print('done')"
    result = run_command([sys.executable, "-c", code])
    assert (result.ok, result.returncode, result.output) == (True, 0, "done")
    assert result.command.startswith(sys.executable)  # recorded as given, without the wrapper


def test_sigterm_saves_and_exits_without_requeue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM (about to be killed) saves and stops; ckptdash leaves requeue to the scheduler."""
    run, log = tmp_path / "run", tmp_path / "scontrol.log"
    fake_scontrol(tmp_path / "bin", log)
    slurm_env(monkeypatch, tmp_path / "bin")
    _, last = train_loop(
        run, total_steps=20, on_step=lambda s: s == 4 and send_self(signal.SIGTERM)
    )
    assert last == 4
    assert not log.exists()
    state = state_of(run)
    assert [c.trigger for c in state.checkpoints.values()] == ["signal"]
    assert (state.attempts[0].outcome, state.attempts[0].end_reason) == ("stopped", "terminated")


def test_a_requeue_signal_after_a_terminate_one_requeues_after_the_one_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM, then SIGUSR2 0.3 s after the SIGTERM's save is made and training stopped
    (submitit's job._interrupt() sends them one scancel apart): one save, and the job is
    requeued as preempted instead of ending "terminated" with nobody to restart it."""
    run, log = tmp_path / "run", tmp_path / "scontrol.log"
    fake_scontrol(tmp_path / "bin", log)
    slurm_env(monkeypatch, tmp_path / "bin")
    with ckptdash.Monitor(run, agree_interval_s=1e-6, poll_interval_s=1e-6) as monitor:
        for step in range(20):
            monitor.step(step)
            if step == 4:
                send_self(signal.SIGTERM)
            if monitor.should_save:
                monitor.save({"step": step})
            if monitor.should_stop:
                # After the save, while the attempt ends (as a second scancel lands).
                threading.Timer(0.3, send_self, args=(signal.SIGUSR2,)).start()
                break
    assert log.read_text().split() == ["requeue", "4242"]
    state = state_of(run)
    assert [(c.trigger, c.step) for c in state.checkpoints.values()] == [("signal", 5)]
    assert [s.signal for s in state.signals] == ["SIGTERM", "SIGUSR2"]
    assert [r.issued for r in state.requeues] == [True]
    assert (state.attempts[0].outcome, state.attempts[0].end_reason) == ("stopped", "preempted")


def test_save_now_and_stop_after_save_apply_once_with_path(tmp_path: Path) -> None:
    """Save now → one manual save, answered applied with its path; Stop after save → a save and
    the loop ends. Each command is answered exactly once."""
    run = tmp_path / "run"
    ids: dict[str, str] = {}

    def commands(step: int) -> None:
        if step == 3:
            ids["save"] = control.issue(run, "save_now", author="ana").id
        if step == 12:
            ids["stop"] = control.issue(run, "stop_after_save", author="ana").id

    _, last = train_loop(run, total_steps=100, on_step=commands)
    assert last is not None
    assert 12 <= last < 100
    state = state_of(run)
    manual = sorted((c.step, c.path) for c in state.checkpoints.values() if c.trigger == "manual")
    assert len(manual) == 2
    for key, (_, path) in zip(("save", "stop"), manual, strict=True):
        cmd = state.commands[ids[key]]
        assert cmd.status == "applied"
        assert cmd.detail == path
    assert state.event_counts.get("command_applied") == 2
    assert control.pending(run) == []


def test_resume_prefers_newer_periodic_and_skips_truncated(tmp_path: Path) -> None:
    """The newest valid checkpoint wins whatever its trigger; a truncated newest one is skipped,
    reported, and the previous one used."""
    import ckptdash

    run = tmp_path / "run"
    with ckptdash.Monitor(run) as m:
        m.step(5)
        sig = m.save(loop_state(5), trigger="signal")
        m.step(8)
        per = m.save(loop_state(8), trigger="periodic")
        m.step(9)
        newest = m.save(loop_state(9), trigger="periodic")
    assert sig and per and newest
    assert ckptdash.resume_path(run) == newest.path
    Path(newest.path).write_bytes(Path(newest.path).read_bytes()[:100])  # torn by a crash
    (run / "checkpoints" / "notes_ckpt_old.txt").write_text("not a checkpoint")
    choice = ckptdash.choose_resume(run)
    assert choice.path == per.path
    assert [p for p, _ in choice.skipped] == [newest.path]
    assert "truncated" in choice.skipped[0][1]

    start, _ = train_loop(run, total_steps=10)
    assert start == 9  # resumed from step 8
    invalid = [e for e in state_of(run).checkpoints.values() if e.status == "invalid"]
    assert [c.path for c in invalid] == [newest.path]


def test_pin_is_used_and_unrecorded_pin_refused(tmp_path: Path) -> None:
    """A pin to a recorded checkpoint wins over newer ones; a pin to any other file is refused."""
    import ckptdash

    run = tmp_path / "run"
    with ckptdash.Monitor(run) as m:
        m.step(1)
        old = m.save(loop_state(1))
        m.step(2)
        new = m.save(loop_state(2))
    assert old and new
    control.update_settings(run, resume_pin=old.path)
    assert ckptdash.choose_resume(run).path == old.path
    stray = tmp_path / "evil.ckpt"
    stray.write_bytes(b"x")
    control.update_settings(run, resume_pin=str(stray))
    choice = ckptdash.choose_resume(run)
    assert choice.path == new.path
    assert "not a checkpoint this run recorded" in choice.skipped[0][1]


def test_checkpoint_carries_its_trigger(tmp_path: Path) -> None:
    """The saved file itself says why it was saved (for the user's own load code)."""
    import torch

    import ckptdash

    with ckptdash.Monitor(tmp_path / "run") as m:
        m.step(3)
        saved = m.save({"w": torch.zeros(2)}, trigger="final")
    assert saved
    meta = torch.load(saved.path, weights_only=True)["ckptdash"]
    assert meta["trigger"] == "final"
    assert meta["step"] == 3
    assert meta["attempt"] == 0
