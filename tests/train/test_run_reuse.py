"""A run directory used again: a changed model, another framework's checkpoint, a pin, a path
saved over and over, a flat script that crashes (issue 23, points 3, 4, 7 and 10)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptdash
from ckptdash import control
from ckptdash.analysis import health
from ckptdash.analysis import preemption as goodput
from ckptdash.cli import main as cli_main
from ckptdash.dash.feed.snapshot import RunSnapshot, SnapshotBuilder
from ckptdash.dash.views import render_goodput
from ckptdash.dash.views.checkpoints import checkpoint_frame
from ckptdash.dash.views.health import render_banner
from ckptdash.resume import check_checkpoint, choose_resume
from ckptdash.state import RunState
from tests.train.helpers import state_of


def snapshot_of(run: Path, state: RunState) -> RunSnapshot:
    return SnapshotBuilder(str(run)).take(
        state,
        sightings=0,
        settings=control.read_settings(run),
        settings_error="",
        settings_key=None,
    )


FAST = {"agree_interval_s": 0.001, "poll_interval_s": 0.001, "pulse_interval_s": 0}


def attempt(
    run: Path, *, width: int, steps: int, save_at: tuple[int, ...] = (), **options: Any
) -> int | None:
    """One attempt of a plain-PyTorch loop whose model is ``Linear(4, width)``: resumes by the
    rule, saves ``checkpoints/step=N.ckpt`` at ``save_at``; returns the step it resumed from."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, width)
    resumed = None
    with ckptdash.Monitor(run, max_steps=steps, **{**FAST, **options}) as monitor:
        state = monitor.load()
        start = 0
        if state is not None:
            model.load_state_dict(state["model"])  # a changed model fails here
            resumed = state["step"]
            start = resumed + 1
        for step in range(start, steps):
            monitor.step(step)
            if step in save_at:
                monitor.save({"model": model.state_dict(), "step": step})
    return resumed


def test_a_changed_model_fails_in_one_line_crash_loops_and_a_fresh_start_lasts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After the model changed, the old checkpoint fails the attempt with one line naming it
    and the fix; the second same failure is a crash loop (alert, requeue skipped and
    suspended); ``ckptdash resume RUN --fresh`` starts fresh, and the old model's
    higher-step checkpoint is never chosen again, also at the attempt after."""
    run = tmp_path / "run"
    attempt(run, width=1, steps=301, save_at=(300,))
    for _ in range(2):
        with pytest.raises(RuntimeError, match="size mismatch") as info:
            attempt(run, width=2, steps=400)
        notes = getattr(info.value, "__notes__", [])
        assert any("step=300.ckpt does not fit this model" in n for n in notes), notes
    state = state_of(run)
    failed = [a for a in state.attempts.values() if a.outcome == "failed"]
    assert len(failed) == 2
    error = failed[-1].end_reason
    assert "\n" not in error and len(error) < 200 + len(str(run)), error
    assert error.startswith(
        "checkpoints/step=300.ckpt does not fit this model (size mismatch for weight:"
        " checkpoint [1, 4], model [2, 4]);"
    )
    assert f"ckptdash resume {run} --fresh" in error
    alert = health.crash_loop(state)
    assert alert is not None and "attempts 1-2 failed the same way" in alert.detail
    assert "crash_loop" in [a.kind for a in health.detect(state)]
    banner = render_banner(snapshot_of(run, state), time.time())
    assert 'data-alert="crash_loop"><b>crash loop</b>' in banner
    assert cli_main(["status", str(run), "--no-scheduler"]) == 0
    status = capsys.readouterr().out
    assert "ALERT crash_loop: attempts 1-2 failed the same way" in status
    row = next(line for line in status.splitlines() if line.startswith("2 "))
    assert "failed (checkpoints/step=300.ckpt does not fit" in row and len(row) < 160, row
    assert any("crash loop" in r.reason and not r.issued for r in state.requeues)
    assert control.read_settings(run).requeue_suspended

    assert cli_main(["resume", str(run), "--fresh"]) == 0
    out = capsys.readouterr().out
    assert "fresh start requested" in out and "back to auto" in out
    assert not control.read_settings(run).requeue_suspended
    assert attempt(run, width=2, steps=50, save_at=(20,)) is None  # fresh: step 300 skipped
    assert not control.read_settings(run).fresh_start  # the request was taken once
    # The next attempt (no request now) resumes from the new model's step 20, not step 300.
    assert attempt(run, width=2, steps=60) == 20
    assert cli_main(["status", str(run), "--no-scheduler"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("300 "))
    assert "saved (before fresh start)" in row
    state = state_of(run)
    frame = checkpoint_frame(snapshot_of(run, state))
    marks = dict(zip(frame["step"], frame["resume"], strict=True))
    assert marks[300] == "before fresh start" and marks[20] == "next"
    fresh = [a for a in state.attempts.values() if a.fresh]
    assert [a.attempt for a in fresh] == [3] and "ckptdash resume --fresh" in fresh[0].fresh


def test_fresh_option_starts_fresh_once_and_its_requeues_resume(tmp_path: Path) -> None:
    """``Monitor(fresh="v2")``: the first attempt with that name starts fresh; the next
    attempts with the same name resume from what v2 saved (not the old model's newer step)."""
    run = tmp_path / "run"
    attempt(run, width=1, steps=301, save_at=(300,))
    assert attempt(run, width=2, steps=30, save_at=(10,), fresh="v2") is None
    assert attempt(run, width=2, steps=30, fresh="v2") == 10
    choice = choose_resume(run)
    assert choice.path is not None and choice.path.endswith("step=10.ckpt")
    with pytest.raises(ckptdash.ConfigError, match="fresh"):
        ckptdash.Monitor(run, fresh="")


def test_a_pin_is_used_once_unless_sticky(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The attempt that loads a pinned checkpoint consumes the pin (its run_resumed says so),
    so the next preemption resumes from what was trained since; ``--sticky`` keeps it, and
    status says which."""
    run = tmp_path / "run"
    attempt(run, width=1, steps=21, save_at=(5, 20))
    pinned = str(run / "checkpoints" / "step=5.ckpt")
    assert cli_main(["resume", str(run), "--pin", pinned]) == 0
    assert cli_main(["status", str(run), "--no-scheduler"]) == 0
    assert "(used once)" in capsys.readouterr().out
    assert attempt(run, width=1, steps=30, save_at=(10,)) == 5
    state = state_of(run)
    assert "pin consumed" in state.attempts[max(state.attempts)].resume_reason
    assert control.read_settings(run).resume_pin is None
    assert attempt(run, width=1, steps=30) == 20  # the newest valid again, not the pin

    assert cli_main(["resume", str(run), "--pin", pinned, "--sticky"]) == 0
    assert cli_main(["status", str(run), "--no-scheduler"]) == 0
    assert "(sticky)" in capsys.readouterr().out
    assert attempt(run, width=1, steps=30) == 5
    assert attempt(run, width=1, steps=30) == 5
    state = state_of(run)
    assert "sticky pin kept" in state.attempts[max(state.attempts)].resume_reason


def test_every_save_of_a_path_saved_over_and_over_is_kept(tmp_path: Path) -> None:
    """nanoGPT's ``ckpt.pt``, saved at every eval, is one row with every save in its record;
    goodput counts each save and finds the loop's interval (no "no periodic saves" beside
    "8 saves"); the resume rule still validates the file's current bytes."""
    run = tmp_path / "run"
    model = torch.nn.Linear(4, 1)
    with ckptdash.Monitor(run, max_steps=100, **FAST) as monitor:
        for step in range(100):
            monitor.step(step)
            if step % 10 == 9 and step < 70:
                monitor.save({"model": model.state_dict(), "step": step}, run / "ckpt.pt")
            if step == 75:
                os.kill(os.getpid(), signal.SIGUSR2)  # a preemption: Young/Daly are shown
            if monitor.should_save:
                monitor.save({"model": model.state_dict(), "step": step})
            if monitor.should_stop:
                break
    state = state_of(run)
    info = state.checkpoints[str(run / "ckpt.pt")]
    assert info.replaced == 6 and len(info.earlier) == 6
    assert [v.step for v in info.earlier] == [9, 19, 29, 39, 49, 59]
    g = goodput.compute(snapshot_of(run, state))
    assert g.saves == 8  # seven of ckpt.pt, one signal save
    assert g.interval_s is not None and g.interval_s > 0
    html = render_goodput(g)
    assert "8 saves" in html and "no periodic saves" not in html
    # The current file is a candidate; the older saves' checksums are history.
    assert check_checkpoint(info) is None and info.step == 69
    os.unlink(run / "checkpoints" / f"step={state.valid_checkpoints()[-1].step}.ckpt")
    assert choose_resume(run).path == str(run / "ckpt.pt")


def test_monitor_says_it_was_preempted(tmp_path: Path) -> None:
    """After the loop, ``monitor.preempted`` tells a signal stop from a finished training."""
    run = tmp_path / "run"
    with ckptdash.Monitor(run, max_steps=100, **FAST) as monitor:
        for step in range(100):
            monitor.step(step)
            if step == 3:
                os.kill(os.getpid(), signal.SIGUSR2)
            if monitor.should_save:
                monitor.save({"step": step})
            if monitor.should_stop:
                break
    assert monitor.preempted
    with ckptdash.Monitor(tmp_path / "other", max_steps=3, **FAST) as done:
        for step in range(3):
            done.step(step)
    assert not done.preempted


def test_a_flat_script_that_crashes_records_run_failed(tmp_path: Path) -> None:
    """A script without a ``with`` block whose loop raises: the attempt is ``failed`` with the
    error (the Monitor's excepthook), not an attempt that looks lost; the traceback still
    prints."""
    run = tmp_path / "run"
    script = textwrap.dedent(
        f"""
        import ckptdash
        monitor = ckptdash.Monitor({str(run)!r}, max_steps=10, pulse_interval_s=0)
        for step in range(10):
            monitor.step(step)
            if step == 4:
                raise ValueError("the data loader ran dry at step 4")
        monitor.close()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 1
    assert "ValueError: the data loader ran dry" in done.stderr  # the usual traceback
    a = state_of(run).attempts[0]
    assert a.outcome == "failed", a
    assert a.end_reason == "ValueError: the data loader ran dry at step 4"
