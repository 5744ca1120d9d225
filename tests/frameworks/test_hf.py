# ruff: noqa: E402  (the tier is skipped, or failed in CI, before transformers is imported)
"""The real Hugging Face Trainer with CkptDashCallback: saves, rotations, signals, commands,
and resume from the newest checkpoint-N whose every file is intact. (Two ranks under torchrun,
a signal to one of them and both resuming together: test_hf_loggers' 2-rank test, one job
that checks the loggers too.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.frameworks.requires import require

require("transformers")

from transformers import TrainerCallback

import ckptdash
from ckptdash import control
from ckptdash.events import decode_metrics
from ckptdash.hf import CkptDashCallback
from ckptdash.state.reading import load_state
from tests.frameworks.hf_tiny import trainer
from tests.train.helpers import fake_scontrol, slurm_env

pytestmark = pytest.mark.integration

FAST = {"agree_interval_s": 1e-4, "poll_interval_s": 1e-4}
REPO_ROOT = Path(__file__).resolve().parents[2]


class AtStep(TrainerCallback):
    """Runs ``action`` once, at the end of step ``step`` (before ckptdash's hook)."""

    def __init__(self, step: int, action: Any) -> None:
        self.step, self.action = step, action

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            self.action()


def _events(run: Path) -> list[Any]:
    from ckptdash.events import decode_lines

    out: list[Any] = []
    for f in sorted((run / "events").iterdir()):
        out += list(decode_lines(f.read_bytes(), str(f)))
    return out


def test_periodic_saves_rotations_heartbeats_and_resume(tmp_path: Path) -> None:
    """Every checkpoint-N is recorded as periodic (the last one as final), the Trainer's
    save_total_limit rotations as removed, heartbeats carry its logged loss; a second
    train() resumes from resume_path's choice and records run_resumed."""
    run, out = tmp_path / "run", tmp_path / "out"
    cb = CkptDashCallback(run, **FAST, heartbeat_interval_s=1e-4)
    t = trainer(out, steps=8, callbacks=[cb], save_steps=2, save_total_limit=2)
    t.train(resume_from_checkpoint=ckptdash.resume_path(run))
    state = load_state(run)
    saved = {Path(p).name: c for p, c in state.checkpoints.items()}
    assert {n: c.status for n, c in saved.items()} == {
        "checkpoint-2": "removed",
        "checkpoint-4": "removed",
        "checkpoint-6": "saved",
        "checkpoint-8": "saved",
    }
    assert [saved[f"checkpoint-{s}"].trigger for s in (2, 4, 6, 8)] == ["periodic"] * 3 + ["final"]
    assert "rotated by the Trainer" in saved["checkpoint-2"].reason
    beats = [e for e in _events(run) if e.KIND == "heartbeat"]
    assert any("loss" in decode_metrics(b.metrics) for b in beats)
    assert ckptdash.resume_path(run) == str(out / "checkpoint-8")

    cb2 = CkptDashCallback(run, **FAST)
    t2 = trainer(out, steps=10, callbacks=[cb2], save_steps=2, save_total_limit=2)
    t2.train(resume_from_checkpoint=ckptdash.resume_path(run))
    assert t2.state.global_step == 10
    resumed = [e for e in _events(run) if e.KIND == "run_resumed"]
    assert [(Path(e.path).name, e.step) for e in resumed] == [("checkpoint-8", 8)]


def test_a_signal_mid_run_saves_requeues_and_train_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGUSR2 during step 3 of a (fake) SLURM job makes the Trainer save checkpoint-3
    (trigger signal) and stop; ckptdash requeues the job once, train() returns normally,
    the attempt ends as preempted, and ``callback.preempted`` tells the script so."""
    run, out = tmp_path / "run", tmp_path / "out"
    fake_scontrol(tmp_path / "bin", tmp_path / "scontrol.log")
    slurm_env(monkeypatch, tmp_path / "bin")
    poke = AtStep(3, lambda: os.kill(os.getpid(), signal.SIGUSR2))
    callback = CkptDashCallback(run, **FAST)
    t = trainer(out, steps=50, callbacks=[poke, callback])
    assert not callback.preempted
    t.train()
    assert callback.preempted
    assert t.state.global_step == 3
    state = load_state(run)
    (info,) = state.checkpoints.values()
    assert Path(info.path).name == "checkpoint-3" and info.trigger == "signal"
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    assert [e.reason for e in _events(run) if e.KIND == "run_finished"] == ["preempted"]


def _train_recording_failure(t: Any, cb: CkptDashCallback) -> None:
    try:
        t.train()
    except BaseException as exc:
        cb.record_failure(exc)
        raise


def test_an_exception_in_train_is_recorded_as_a_failed_attempt(tmp_path: Path) -> None:
    """train() raising (the Trainer tells no callback) is recorded as run_failed when the
    caller hands the exception to record_failure, as the docs show."""
    run, out = tmp_path / "run", tmp_path / "out"

    def boom() -> None:
        raise RuntimeError("loss is NaN")

    cb = CkptDashCallback(run, **FAST)
    t = trainer(out, steps=10, callbacks=[AtStep(2, boom), cb])
    with pytest.raises(RuntimeError, match="NaN"):
        _train_recording_failure(t, cb)
    assert load_state(run).attempts[0].outcome == "failed"
    assert not cb.preempted


def test_save_now_then_stop_after_save(tmp_path: Path) -> None:
    """Command files (as the CLI writes them): Save now makes the Trainer save at the next
    step boundary with trigger manual and train on; Stop after save makes it save again
    and end train() early. Both commands are applied."""
    run, out = tmp_path / "run", tmp_path / "out"
    save_now = AtStep(2, lambda: control.issue(run, "save_now"))
    stop = AtStep(5, lambda: control.issue(run, "stop_after_save"))
    t = trainer(out, steps=20, callbacks=[save_now, stop, CkptDashCallback(run, **FAST)])
    t.train()
    state = load_state(run)
    manual = sorted(c.step or 0 for c in state.checkpoints.values() if c.trigger == "manual")
    assert len(manual) == 2 and manual[0] in (2, 3) and manual[1] in (5, 6)
    assert t.state.global_step == manual[1]
    assert [c.status for c in state.commands.values()] == ["applied", "applied"]


def test_a_damaged_newest_checkpoint_is_skipped_and_the_previous_one_resumed(
    tmp_path: Path,
) -> None:
    """With optimizer.pt deleted from the newest checkpoint-N, resume_path returns the one
    before; the next attempt records the skip naming the file, and resumes from there."""
    run, out = tmp_path / "run", tmp_path / "out"
    t = trainer(out, steps=4, callbacks=[CkptDashCallback(run, **FAST)], save_steps=2)
    t.train()
    (out / "checkpoint-4" / "optimizer.pt").unlink()
    assert ckptdash.resume_path(run) == str(out / "checkpoint-2")
    t2 = trainer(out, steps=5, callbacks=[CkptDashCallback(run, **FAST)], save_steps=2)
    t2.train(resume_from_checkpoint=ckptdash.resume_path(run))
    events = _events(run)
    (invalid,) = [e for e in events if e.KIND == "checkpoint_invalid"]
    assert invalid.path == str(out / "checkpoint-4") and "optimizer.pt missing" in invalid.reason
    (resumed,) = [e for e in events if e.KIND == "run_resumed"]
    assert resumed.path == str(out / "checkpoint-2") and resumed.step == 2


KILLED_MID_SAVE = """
import os, sys
from pathlib import Path
from transformers import TrainerCallback
from ckptdash.hf import CkptDashCallback
from tests.frameworks.hf_tiny import trainer

run, out = Path(sys.argv[1]), Path(sys.argv[2])

class KillDuringSave(TrainerCallback):
    # on_log runs after on_step_end and before the Trainer writes checkpoint-4: leave what a
    # kill in the middle of that write leaves, then die without any cleanup.
    def on_log(self, args, state, control, **kwargs):
        if state.global_step == 4:
            (out / "checkpoint-4").mkdir()
            (out / "checkpoint-4" / "model.safetensors").write_bytes(b"half")
            os._exit(9)

t = trainer(out, steps=6, callbacks=[CkptDashCallback(run), KillDuringSave()], save_steps=2)
t.train()
"""


def test_a_kill_during_the_trainers_save_is_an_interrupted_save(tmp_path: Path) -> None:
    """A process killed while the Trainer writes checkpoint-4 leaves a half folder that the
    Trainer's own rule (highest checkpoint-N) would resume from; ckptdash's resume_path
    returns checkpoint-2, and the next attempt records checkpoint-4 as interrupted."""
    from transformers.trainer_utils import get_last_checkpoint

    run, out = tmp_path / "run", tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", KILLED_MID_SAVE, str(run), str(out)],
        env=env, capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 9, done.stderr.decode()[-3000:]
    assert get_last_checkpoint(str(out)) == str(out / "checkpoint-4")
    assert ckptdash.resume_path(run) == str(out / "checkpoint-2")
    t = trainer(out, steps=6, callbacks=[CkptDashCallback(run, **FAST)], save_steps=2)
    t.train(resume_from_checkpoint=ckptdash.resume_path(run))
    interrupted = [
        e for e in _events(run) if e.KIND == "checkpoint_failed" and "interrupted" in e.error
    ]
    assert [Path(e.path).name for e in interrupted] == ["checkpoint-4"]
    assert load_state(run).checkpoints[str(out / "checkpoint-4")].status == "saved"  # saved again


def test_save_only_model_checkpoints_are_artifacts_never_resumed(tmp_path: Path) -> None:
    """HF cannot resume a ``save_only_model=True`` checkpoint: each checkpoint-N (periodic,
    and the save a SIGUSR2 asked for) is recorded as an artifact, the rule passes them over
    and says so, and the next train() starts fresh instead of failing to load one."""
    from ckptdash.hf import SAVE_ONLY_MODEL

    run, out = tmp_path / "run", tmp_path / "out"
    poke = AtStep(3, lambda: os.kill(os.getpid(), signal.SIGUSR2))
    t = trainer(
        out, steps=8, callbacks=[poke, CkptDashCallback(run, **FAST)], save_steps=2,
        save_only_model=True,
    )  # fmt: skip
    with pytest.warns(RuntimeWarning, match=r"save_only_model=True\): HF cannot resume"):
        t.train()
    saved = {Path(p).name: c for p, c in load_state(run).checkpoints.items()}
    assert set(saved) == {"checkpoint-2", "checkpoint-3"}
    assert {c.artifact for c in saved.values()} == {SAVE_ONLY_MODEL}
    assert saved["checkpoint-3"].trigger == "signal"
    choice = ckptdash.choose_resume(run)
    assert choice.path is None and "passed over checkpoint-3" in choice.reason

    t2 = trainer(out, steps=2, callbacks=[CkptDashCallback(run, **FAST)], save_only_model=True)
    t2.train(resume_from_checkpoint=ckptdash.resume_path(run))
    assert t2.state.global_step == 2
