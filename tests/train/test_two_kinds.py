"""Two kinds of checkpoint in a plain loop: its full state resumes training, the model's
weights saved for evaluation are artifacts. Preempted (SIGUSR2) and killed (SIGKILL), each
attempt resumes from the newest full state, the reason names the newer artifacts passed
over, and a pin (or ``ckpt_path``) of an artifact is refused saying why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ckptdash
from ckptdash import control
from ckptdash.cli import main
from ckptdash.resume import judge_given
from ckptdash.train.checkpoints.artifacts import SAID_SO, STATE_DICT_ALONE
from tests.train.helpers import state_of
from tests.train.plain_two_kinds_worker import main as worker_main
from tests.train.test_distributed import job_env

WORKER = Path(__file__).with_name("plain_two_kinds_worker.py")


def _launch(tmp_path: Path, run: Path, *options: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(WORKER), str(run), *options]
    return subprocess.run(
        argv, env=job_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=120
    )


def _in_process(monkeypatch: pytest.MonkeyPatch, run: Path, *options: str) -> None:
    monkeypatch.setattr(sys, "argv", [str(WORKER), str(run), *options])
    worker_main()


def test_a_plain_loop_saving_both_kinds_is_preempted_killed_and_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Full state every 4 steps, ``model.state_dict()`` every 3 and after the signal save:
    the state_dicts are recorded as artifacts by themselves; after SIGUSR2 at step 6 (this
    process) and SIGKILL at step 13 (a child) each next attempt resumes from the newest full
    state (steps 6, 11), passing over the newer artifact at the same step, and runs on from
    the next step."""
    run = tmp_path / "run"
    _in_process(monkeypatch, run, "--steps", "20", "--signal-at", "6")
    killed = _launch(tmp_path, run, "--steps", "20", "--kill-at", "13")
    assert killed.returncode == -9 and "first step 7" in killed.stdout, killed.stderr[-2000:]
    capsys.readouterr()
    _in_process(monkeypatch, run, "--steps", "16")
    assert "first step 12" in capsys.readouterr().out
    state = state_of(run)
    kinds = {Path(c.path).name: c.artifact for c in state.checkpoints.values()}
    assert kinds["model-11.pt"] == STATE_DICT_ALONE and kinds["step=11.ckpt"] == ""
    for attempt, step in ((1, 6), (2, 11)):
        a = state.attempts[attempt]
        assert a.resumed_from == str(run / "checkpoints" / f"step={step}.ckpt")
        assert f"passed over model-{step}.pt" in a.resume_reason


def _saved_both(run: Path) -> tuple[str, str]:
    """A full state at step 3 and, at step 5, weights saved with ``resumable=False``."""
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ckptdash.Monitor(run, max_steps=10, pulse_interval_s=0) as monitor:
        monitor.step(3)
        full = monitor.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": 3})
        monitor.step(5)
        weights = monitor.save({"model": model.state_dict(), "step": 5}, resumable=False)
    assert full is not None and weights is not None and weights.artifact == SAID_SO
    return full.path, weights.path


def test_a_pin_of_an_artifact_is_refused_saying_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ckptdash resume RUN --pin`` of an artifact fails naming it and why; a pin of one
    already in the settings is not used (the rule says so and resumes from the full state),
    and ``fit(ckpt_path=...)`` of one is refused naming the checkpoint to use instead."""
    run = tmp_path / "run"
    full, weights = _saved_both(run)
    assert main(["resume", str(run), "--pin", weights]) == 2
    err = capsys.readouterr().err
    assert "is an artifact (saved with resumable=False)" in err and "cannot resume" in err

    control.update_settings(run, resume_pin=weights)
    choice = ckptdash.choose_resume(run)
    assert choice.path == full
    assert "pinned, refused: saved with resumable=False" in choice.reason
    verdict = judge_given(run, weights)
    assert verdict.error is not None and "it is an artifact" in verdict.error
    assert f"The newest valid checkpoint is {full}" in verdict.error
    assert state_of(run).checkpoints[weights].status == "saved"  # refused, not invalid
    capsys.readouterr()
    assert main(["status", str(run)]) == 0
    rows = {
        r[-1]: r[:4] for r in (line.split() for line in capsys.readouterr().out.splitlines()) if r
    }
    assert rows["checkpoints/step=3.ckpt"] == ["3", "api", "resumes", "saved"]
    assert rows["checkpoints/step=5.ckpt"] == ["5", "api", "artifact", "saved"]


def test_a_link_leaving_the_runs_checkpoint_folders_is_refused(tmp_path: Path) -> None:
    """A ``last.ckpt`` link planted beside the checkpoints (docs/security.md), pointing at a
    file outside the run's folders: given as ``ckpt_path`` it is refused naming where it
    leads; a link to the run's own checkpoint is judged as that checkpoint."""
    run = tmp_path / "run"
    full, _weights = _saved_both(run)
    stranger = tmp_path / "elsewhere.ckpt"
    torch.save({"model": {}}, stranger)
    planted = run / "checkpoints" / "last.ckpt"
    planted.symlink_to(stranger)
    verdict = judge_given(run, planted)
    assert verdict.error is not None and f"a symbolic link to {stranger}" in verdict.error
    own = run / "checkpoints" / "own-last.ckpt"
    own.symlink_to(Path(full).name)
    verdict = judge_given(run, own)
    assert verdict.error is None and verdict.load == full
    assert "through the link own-last.ckpt" in verdict.reason


def test_a_plain_loop_misfit_names_the_older_checkpoint_that_fits_never_start_fresh(
    tmp_path: Path,
) -> None:
    """A plain loop cannot be handed another file after its own load failed: the one line,
    and the crash-loop alert after the second same failure, name the older checkpoint to
    pin (``--pin checkpoints/step=5.ckpt``) instead of "start fresh", which would throw it
    away."""
    from ckptdash.analysis import health
    from tests.train.test_run_reuse import attempt

    run = tmp_path / "run"
    attempt(run, width=1, steps=6, save_at=(5,))
    with ckptdash.Monitor(run, max_steps=301, pulse_interval_s=0) as monitor:
        monitor.step(300)  # another model's checkpoint, newer
        monitor.save({"model": torch.nn.Linear(4, 2).state_dict(), "step": 300})
    pin = f"ckptdash resume {run} --pin checkpoints/step=5.ckpt"
    for _ in range(2):
        with pytest.raises(RuntimeError, match="size mismatch") as info:
            attempt(run, width=1, steps=400)
        notes = " ".join(getattr(info.value, "__notes__", []))
        assert "an older checkpoint that resumes training is checkpoints/step=5.ckpt" in notes
        assert pin in notes
    alert = health.crash_loop(state_of(run))
    assert alert is not None and f"pin the older checkpoint the error names: `{pin}`" in (
        alert.detail
    )
    assert "start fresh" not in alert.detail
