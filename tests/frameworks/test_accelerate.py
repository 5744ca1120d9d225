# ruff: noqa: E402  (the tier is skipped, or failed in CI, before accelerate is imported)
"""Accelerate's save_state/load_state through ckptdash, with automatic checkpoint naming."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.frameworks.requires import require

require("accelerate")

from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration

import ckptdash
import ckptdash.accelerate
from ckptdash.resume import choose_resume
from ckptdash.rundir import manifest
from ckptdash.state.reading import load_state
from tests.frameworks.launch import torchrun2

pytestmark = pytest.mark.integration

FAST = {"agree_interval_s": 1e-4, "poll_interval_s": 1e-4, "install_signals": False}


def _prepared(project: Path) -> tuple[Accelerator, torch.nn.Module]:
    config = ProjectConfiguration(
        project_dir=str(project), automatic_checkpoint_naming=True, total_limit=2
    )
    acc = Accelerator(cpu=True, project_config=config)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    return acc, model


def test_save_state_rotations_and_resume_past_a_damaged_save(tmp_path: Path) -> None:
    """Every checkpoint_N that save_state writes is recorded, total_limit deletions as
    removed; with a file deleted from the newest, load_state loads the previous one, and
    the next save_state continues numbering after the damaged folder instead of failing."""
    run, project = tmp_path / "run", tmp_path / "project"
    acc, model = _prepared(project)
    with ckptdash.Monitor(run, **FAST) as monitor:
        assert ckptdash.accelerate.load_state(monitor, acc) is None
        for step in range(3):
            with torch.no_grad():
                model.weight.fill_(float(step))
            monitor.step(step)
            ckptdash.accelerate.save_state(monitor, acc)
    ckpts = project / "checkpoints"
    state = load_state(run)
    assert {Path(p).name: c.status for p, c in state.checkpoints.items()} == {
        "checkpoint_0": "removed",
        "checkpoint_1": "saved",
        "checkpoint_2": "saved",
    }
    (victim,) = [p for p in (ckpts / "checkpoint_2").iterdir() if p.name.startswith("optimizer")]
    victim.unlink()

    acc2, model2 = _prepared(project)
    with ckptdash.Monitor(run, **FAST) as monitor:
        path = ckptdash.accelerate.load_state(monitor, acc2)
        assert path == ckpts / "checkpoint_1"
        assert torch.equal(model2.weight.detach(), torch.full((2, 4), 1.0))
        monitor.step(3)
        saved = ckptdash.accelerate.save_state(monitor, acc2)
    assert saved is not None and Path(saved.path).name == "checkpoint_3"
    invalid = [e for e in load_state(run).checkpoints.values() if e.status == "invalid"]
    assert [Path(c.path).name for c in invalid] == ["checkpoint_2"]
    assert f"{victim.name} missing" in invalid[0].reason


def test_save_state_into_a_named_folder_is_published_atomically(tmp_path: Path) -> None:
    """Without automatic naming, save_state(monitor, accelerator, path) writes into a temp
    folder that appears under its name only complete, with a manifest, and resumes."""
    run, target = tmp_path / "run", tmp_path / "out" / "latest"
    acc = Accelerator(cpu=True)
    model = acc.prepare(torch.nn.Linear(4, 2))
    with ckptdash.Monitor(run, **FAST) as monitor:
        monitor.step(4)
        ckptdash.accelerate.save_state(monitor, acc, target, trigger="periodic")
    assert (target / ".ckptdash-manifest.json").exists()
    assert [p.name for p in target.parent.iterdir()] == ["latest"]
    with torch.no_grad():
        model.weight.zero_()
    with ckptdash.Monitor(run, **FAST) as monitor:
        assert ckptdash.accelerate.load_state(monitor, acc) == target
    assert model.weight.abs().sum() > 0


def test_two_ranks_save_rotate_and_resume_together(tmp_path: Path) -> None:
    """torchrun x2 (gloo): every save_state is recorded once, after both ranks wrote (its
    manifest lists each rank's RNG state), total_limit's deletion is recorded as removed; with
    the newest save damaged, a second launch resumes both ranks from the one before it, with
    the weights and progress that save held, and numbering continues after the damaged one
    (which total_limit then rotates away, recorded)."""
    run, project = tmp_path / "run", tmp_path / "project"
    script = Path(__file__).with_name("accelerate_worker.py")
    torchrun2(tmp_path, "first", script, str(run), str(project), "9")
    state = load_state(run)
    assert {Path(p).name: c.status for p, c in state.checkpoints.items()} == {
        "checkpoint_0": "removed",
        "checkpoint_1": "saved",
        "checkpoint_2": "saved",
    }
    assert sorted(c.step for c in state.checkpoints.values() if c.status == "saved") == [5, 8]
    newest = project / "checkpoints" / "checkpoint_2"
    files = {e.path for e in manifest.read(newest)[0].files}
    assert {"random_states_0.pkl", "random_states_1.pkl"} <= files
    (newest / "random_states_1.pkl").unlink()  # rank 1's part of the newest save is lost
    choice = choose_resume(run)
    assert choice.path == str(project / "checkpoints" / "checkpoint_1")
    assert [(p, "random_states_1.pkl missing" in why) for p, why in choice.skipped] == [
        (str(newest), True)
    ]

    torchrun2(tmp_path, "resume", script, str(run), str(project), "12")
    reports = [json.loads(Path(f"{run}.rank{r}.json").read_text()) for r in (0, 1)]
    expected = {"world": 2, "start": 6, "loaded": "checkpoint_1", "loaded_ok": True}
    assert reports == [expected] * 2
    state = load_state(run)
    assert {Path(p).name: (c.status, c.step) for p, c in state.checkpoints.items()} == {
        "checkpoint_0": ("removed", 2),
        "checkpoint_1": ("removed", 5),
        "checkpoint_2": ("removed", 8),  # damaged, then rotated away by total_limit
        "checkpoint_3": ("saved", 8),
        "checkpoint_4": ("saved", 11),
    }
