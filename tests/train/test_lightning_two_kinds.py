"""Two kinds of Lightning checkpoint: what resumes training, and what is an artifact, a link
or a copy. Real Lightning on CPU, killed (SIGKILL, in a child process) or preempted (SIGUSR2,
in this one) and resumed: weights-only "best" files beside full ones, ``save_last=True`` and
``"link"``, ``ckpt_path="last"`` and ``"hpc"``, and a fit that fails before its callbacks'
setup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptdash
from tests.train.helpers import state_of

L = pytest.importorskip("lightning.pytorch", reason="install the lightning extra: make test")
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

from ckptdash.lightning.checkpoint_io import WEIGHTS_ONLY  # noqa: E402
from ckptdash.lightning.fit_start import HPC_LINE  # noqa: E402
from tests.train.test_distributed import job_env  # noqa: E402
from tests.train.test_lightning import Tiny, callback, trainer  # noqa: E402
from tests.train.test_lightning_reuse import fit as fit_wide  # noqa: E402
from tests.train.two_kinds_worker import both_kinds  # noqa: E402
from tests.train.two_kinds_worker import main as worker_main  # noqa: E402

WORKER = Path(__file__).with_name("two_kinds_worker.py")


def _launch(tmp_path: Path, run: Path, *options: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(WORKER), str(run), *options]
    return subprocess.run(
        argv, env=job_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=180
    )


def _resumed(run: Path, attempt: int) -> tuple[str, str]:
    a = state_of(run).attempts[attempt]
    assert a.resumed_from, f"attempt {attempt} did not resume"
    return a.resumed_from, a.resume_reason


def _resumed_step(run: Path, attempt: int) -> int:
    (e,) = [e for e in _events(run) if e["kind"] == "run_resumed" and e["attempt"] == attempt]
    return int(e["step"])


def _events(run: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted((run / "events").iterdir()):
        out += [json.loads(line) for line in f.read_text().splitlines()]
    return sorted(out, key=lambda e: e["t"])


def test_a_kill_after_a_weights_only_best_resumes_from_the_full_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33, 1: ModelCheckpoint(every 4, save_last=True) beside a weights-only "best"
    (save_weights_only=True, top 1), SIGKILL at step 10. The newest file is best-step=9, an
    artifact: the record says so, the rule passes it over (and says so) and the next attempt
    resumes from step 8, trains to the end, no crash loop."""
    run = tmp_path / "run"
    killed = _launch(tmp_path, run, "--max-steps", "20", "--kill-at", "10")
    assert killed.returncode == -9, killed.stderr[-2000:]
    state = state_of(run)
    (best,) = [c for c in state.checkpoints.values() if c.status == "saved" and c.step == 9]
    assert best.artifact == WEIGHTS_ONLY and not best.resumable
    full = [c for c in state.checkpoints.values() if c.status == "saved" and c.step == 8]
    assert full and all(c.resumable for c in full)
    choice = ckptdash.choose_resume(run)
    assert choice.step == 8 and "passed over best-step=9.ckpt" in choice.reason

    monkeypatch.setattr(sys, "argv", [str(WORKER), str(run), "--max-steps", "12"])
    worker_main()  # the next attempt, in this process
    state = state_of(run)
    assert state.attempts[1].outcome == "finished"
    path, reason = _resumed(run, 1)
    assert _resumed_step(run, 1) == 8 and state.checkpoints[path].resumable
    assert "passed over best-step=9.ckpt" in reason
    kinds = {c["path"]: (c["resumes"], c["kind"]) for c in ckptdash.checkpoints(run)}
    assert kinds["best/best-step=9.ckpt"] == (False, "artifact")
    assert kinds["full/epoch=0-step=8.ckpt"] == (True, "resumes")


def _forget_artifacts(run: Path) -> None:
    """Make the log look written before records said what a checkpoint can do."""
    for f in (run / "events").iterdir():
        lines = [json.loads(line) for line in f.read_text().splitlines()]
        for e in lines:
            e.pop("artifact", None)
        f.write_text("".join(json.dumps(e) + "\n" for e in lines))


def test_an_unmarked_weights_only_checkpoint_is_refused_at_load_and_the_full_one_loaded(
    tmp_path: Path,
) -> None:
    """A run recorded before records said what a checkpoint can do: the rule takes the newer
    weights-only best as resumable, Lightning reads it, ckptdash sees it has no optimizer
    state, records it as refused and loads the older full checkpoint instead — the same
    attempt trains on (before: the attempt failed, and every next one the same way)."""
    run = tmp_path / "run"
    trainer(run, 10, [callback(run, pulse_interval_s=0), *both_kinds(run, 4, True)]).fit(Tiny())
    _forget_artifacts(run)
    assert ckptdash.choose_resume(run).step == 9  # taken for resumable, as older runs read

    t = trainer(run, 12, [callback(run, pulse_interval_s=0), *both_kinds(run, 4, True)])
    t.fit(Tiny())
    assert t.global_step == 12
    state = state_of(run)
    assert state.attempts[1].outcome == "finished"
    _path, reason = _resumed(run, 1)
    assert _resumed_step(run, 1) == 8
    assert "fell back from best-step=9.ckpt" in reason
    (best,) = [c for c in state.checkpoints.values() if c.path.endswith("best-step=9.ckpt")]
    assert best.status == "invalid" and "cannot resume training" in best.reason


def test_a_newer_checkpoint_that_does_not_fit_falls_back_to_an_older_one_that_does(
    tmp_path: Path,
) -> None:
    """A plain-PyTorch step=300.ckpt, newer than the run's Lightning checkpoint: Lightning
    cannot read it, so the attempt falls back to the Lightning one (recording why step=300
    was refused) instead of failing at every start; "start fresh" is never the advice while
    a checkpoint that fits exists."""
    run = tmp_path / "run"
    fit_wide(run, width=1, max_steps=5)  # and saves checkpoints/lightning-5.ckpt
    with ckptdash.Monitor(run, max_steps=301, pulse_interval_s=0) as monitor:
        monitor.step(300)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        monitor.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": 300})
    t = fit_wide(run, width=1, max_steps=8)
    assert t.global_step == 8
    state = state_of(run)
    path, reason = _resumed(run, 2)
    assert Path(path).name == "lightning-5.ckpt"
    assert "fell back from step=300.ckpt" in reason
    (bad,) = [c for c in state.checkpoints.values() if c.path.endswith("step=300.ckpt")]
    assert bad.status == "invalid" and "does not fit this model" in bad.reason


def test_save_last_link_is_followed_across_a_preemption_and_ckpt_path_last(
    tmp_path: Path,
) -> None:
    """Issue 33, 3 and 5: SIGUSR2 before ModelCheckpoint's first save: ckptdash makes
    last.ckpt a link to its signal save, recorded as such before the attempt ends (not a
    periodic save after it), and the next attempt's "resumed from" names the signal save.
    Each later link update is recorded with its target, and fit(ckpt_path="last") loads
    the target the link points at (before: refused, as the link's record was stale)."""
    run = tmp_path / "run"

    def mc() -> ModelCheckpoint:
        return ModelCheckpoint(
            dirpath=run / "mc", every_n_train_steps=4, save_top_k=-1, save_last="link"
        )

    trainer(run, 20, [callback(run, pulse_interval_s=0), mc()]).fit(Tiny(signal_at=2))
    state = state_of(run)
    (signal_save,) = [c for c in state.checkpoints.values() if c.same_as is None]
    last = state.checkpoints[str(run / "mc" / "last.ckpt")]
    assert last.same_as == signal_save.path and os.path.islink(last.path)
    order = [e["kind"] for e in _events(run)]
    assert order.index("run_finished") > max(
        i for i, k in enumerate(order) if k == "checkpoint_saved"
    )

    trainer(run, 12, [callback(run, pulse_interval_s=0), mc()]).fit(Tiny())
    path, _ = _resumed(run, 1)
    assert path == signal_save.path  # the signal save, not last.ckpt
    last = state_of(run).checkpoints[str(run / "mc" / "last.ckpt")]
    assert last.same_as == str(run / "mc" / "epoch=0-step=12.ckpt") and last.step == 12

    t = trainer(run, 14, [callback(run, pulse_interval_s=0), mc()])
    t.fit(Tiny(), ckpt_path="last")
    assert t.global_step == 14
    path, reason = _resumed(run, 2)
    assert path == str(run / "mc" / "epoch=0-step=12.ckpt")
    assert "through the link last.ckpt" in reason


def test_save_last_true_after_a_signal_save_is_a_copy_of_it(tmp_path: Path) -> None:
    """Issue 33, 5 with save_last=True: the last.ckpt Lightning would write after ckptdash's
    signal save is a copy of it, recorded as such (same step, the signal's trigger, before
    the attempt ends); fit(ckpt_path="last") then names the signal save as resumed from."""
    run = tmp_path / "run"

    def mc() -> ModelCheckpoint:
        return ModelCheckpoint(dirpath=run / "mc", every_n_train_steps=50, save_last=True)

    trainer(run, 20, [callback(run, pulse_interval_s=0), mc()]).fit(Tiny(signal_at=2))
    state = state_of(run)
    (signal_save,) = [c for c in state.checkpoints.values() if c.same_as is None]
    last = state.checkpoints[str(run / "mc" / "last.ckpt")]
    assert last.same_as == signal_save.path and not os.path.islink(last.path)
    assert (last.step, last.trigger, last.size_bytes) == (3, "signal", signal_save.size_bytes)
    assert [c.attempt for c in state.checkpoints.values()] == [0, 0]

    t = trainer(run, 6, [callback(run, pulse_interval_s=0), mc()])
    t.fit(Tiny(), ckpt_path="last")
    assert t.global_step == 6
    path, reason = _resumed(run, 1)
    assert path == signal_save.path and "the copy last.ckpt stands for it" in reason


def test_ckpt_path_hpc_resumes_by_the_rule_and_a_fit_failing_at_start_is_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 33, 4: fit(ckpt_path="hpc") resumes from the rule's choice (the signal save),
    saying so in one line and in the resume reason (before: Lightning's ValueError at every
    attempt, none recorded). A fit that Lightning refuses before any callback hook
    (ckpt_path="best" without a ModelCheckpoint) is recorded as a failed attempt."""
    run = tmp_path / "run"
    trainer(run, 20, [callback(run, pulse_interval_s=0)]).fit(Tiny(signal_at=2))
    t = trainer(run, 6, [callback(run, pulse_interval_s=0)])
    t.fit(Tiny(), ckpt_path="hpc")
    assert t.global_step == 6
    assert HPC_LINE in capsys.readouterr().err
    _path, reason = _resumed(run, 1)
    assert _resumed_step(run, 1) == 3  # the signal save's step
    assert 'ckpt_path="hpc"' in reason

    bare = trainer(run, 8, [callback(run, pulse_interval_s=0)], enable_checkpointing=False)
    with pytest.raises(ValueError, match="best"):
        bare.fit(Tiny(), ckpt_path="best")
    failed = state_of(run).attempts[2]
    assert failed.outcome == "failed" and "ValueError" in failed.end_reason
