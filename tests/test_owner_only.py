"""A run writable by its owner alone (issue 35), with one account: folders made without group
write whatever the umask, a group-writable one named by the readers as untrusted, and
tightened by the owner's next attempt. (Two real accounts: tests/security/test_owner_only.py.)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckptdash import Monitor
from ckptdash.cli.status import render_run_lines, render_status
from ckptdash.rundir import RunDir, door
from ckptdash.state.reading import load_state


def _attempt(run: Path) -> None:
    with Monitor(run, install_signals=False) as m:
        m.load()
        m.step(1)
        m.save({"step": 1})


def test_folders_are_made_without_group_write_whatever_the_umask(tmp_path: Path) -> None:
    """Under umask 000 every folder of a new run is still 0755 (and nothing is untrusted)."""
    old = os.umask(0)
    try:
        _attempt(tmp_path / "run")
    finally:
        os.umask(old)
    for folder, _, _ in os.walk(tmp_path / "run"):
        assert os.stat(folder).st_mode & 0o777 == 0o755, folder
    assert door.untrusted(tmp_path / "run") == ""


def test_a_group_writable_folder_is_shown_untrusted_then_tightened(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """events/ made group-writable (a run from before): ``status`` names it untrusted with the
    fix; the owner's next attempt removes the group write, says so once, and the run is
    trusted again."""
    run = tmp_path / "run"
    _attempt(run)
    os.chmod(run / "events", 0o2775)
    why = door.untrusted(run)
    assert f"{run}/events" in why and "chmod g-w" in why
    state = load_state(run)
    assert "UNTRUSTED:" in render_status(RunDir(run), state)
    assert "(untrusted)" in render_run_lines([RunDir(run)], [state])
    capsys.readouterr()
    _attempt(run)
    said = [line for line in capsys.readouterr().err.splitlines() if "removed group" in line]
    assert len(said) == 1 and f"{run}/events" in said[0]
    assert not os.stat(run / "events").st_mode & 0o022
    assert door.untrusted(run) == ""
