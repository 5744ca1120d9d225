"""The control channel's security rules: pins limited to recorded checkpoints, validation
that never unpickles, owner-only control files that say who wrote them."""

from __future__ import annotations

import getpass
import os
import pickle
import socket
import stat
from pathlib import Path
from typing import Any

import pytest
import torch

from ckptdash import Monitor, choose_resume, control, resume_path
from ckptdash.cli import main as cli
from ckptdash.events import CheckpointSaved, CommandRejected
from ckptdash.rundir import RunDir
from ckptdash.rundir.hashing import checksum_file
from ckptdash.rundir.writer import EventWriter
from tests.reliability import faults


def _run_with_two_checkpoints(run: Path) -> list[str]:
    paths = []
    with Monitor(run, install_signals=False) as monitor:
        for step in (1, 2):
            monitor.step(step)
            saved = monitor.save({"step": step})
            assert saved is not None
            paths.append(saved.path)
    return paths


def test_a_pin_can_only_name_a_checkpoint_the_run_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A loadable torch file the run never recorded, pinned by the CLI or written straight
    into the settings, is refused and never loaded; so are a symbolic link to a recorded
    checkpoint (pinned by its own path) and a recorded checkpoint whose bytes were swapped
    for others of the same size. The resume rule falls back to the newest valid checkpoint
    and says why. A pin naming a recorded, intact checkpoint (however spelled) is used."""
    run = tmp_path / "run"
    first, second = _run_with_two_checkpoints(run)
    evil = run / "checkpoints" / "evil.ckpt"
    torch.save({"step": 99}, evil)

    assert cli(["resume", str(run), "--pin", str(evil)]) != 0
    assert "not a checkpoint this run recorded" in capsys.readouterr().err
    assert control.read_settings(run).resume_pin is None

    link = run / "checkpoints" / "link.ckpt"
    link.symlink_to(first)
    for pin in (str(evil), str(link)):
        control.update_settings(run, resume_pin=pin)
        choice = choose_resume(run)
        assert choice.path == second
        assert (pin, "pinned path is not a checkpoint this run recorded; refused") in choice.skipped
        with Monitor(run, install_signals=False) as monitor:
            assert monitor.load()["step"] == 2

    spelled = str(run / "checkpoints" / ".." / "checkpoints" / Path(first).name)
    control.update_settings(run, resume_pin=spelled)
    assert resume_path(run) == first

    size = Path(first).stat().st_size
    swapped = bytearray(Path(first).read_bytes())
    swapped[-30] ^= 0xFF
    Path(first).write_bytes(bytes(swapped))
    assert Path(first).stat().st_size == size
    choice = choose_resume(run)
    assert choice.path == second
    assert any(
        "pinned checkpoint is invalid" in why and "checksum" in why for _, why in choice.skipped
    )


class _Boom:
    """Unpickling this runs code: the marker file would appear."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


@pytest.fixture
def no_unpickling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every unpickling entry point fail the test if called."""

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("something unpickled a checkpoint while validating it")

    for target, name in [
        (pickle, "load"),
        (pickle, "loads"),
        (pickle, "Unpickler"),
        (torch, "load"),
    ]:
        monkeypatch.setattr(target, name, forbidden)


def test_choosing_and_showing_the_resume_checkpoint_never_unpickles(
    tmp_path: Path, no_unpickling: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """A recorded checkpoint that is a malicious pickle (unpickling it creates a file) is
    validated by size and checksum, chosen and shown by ``choose_resume``,
    ``resume_path``, ``ckptdash status`` and ``ckptdash resume`` — and nothing unpickles
    it: no unpickler is called and the marker file never appears."""
    run, marker = tmp_path / "run", tmp_path / "pwned"
    RunDir(run).ensure()
    evil = run / "checkpoints" / "step=5.ckpt"
    evil.write_bytes(pickle.dumps({"step": 5, "x": _Boom(marker)}))
    size, checksum = checksum_file(evil)
    with EventWriter(run, attempt=0) as w:
        w.emit(
            CheckpointSaved,
            step=5,
            path=str(evil),
            trigger="signal",
            size_bytes=size,
            duration_s=0.1,
            checksum=checksum,
        )
    assert choose_resume(run).path == str(evil)
    assert resume_path(run) == str(evil)
    control.update_settings(run, resume_pin=str(evil))
    assert cli(["status", str(run)]) == 0
    assert cli(["resume", str(run)]) == 0
    assert str(evil) in capsys.readouterr().out
    assert not marker.exists()


def test_control_files_are_owner_only_and_say_who_wrote_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Even under umask 000, commands from ``control.issue`` and the CLI, the settings file
    and its lock are created 0600 and carry author and host; ``ckptdash status`` shows
    them. A command file without author or host is rejected by the job, with the reason."""
    run = tmp_path / "run"
    RunDir(run).ensure()
    user, host = getpass.getuser(), socket.gethostname()
    old = os.umask(0)
    try:
        control.issue(run, "save_now")
        assert cli(["save", str(run)]) == 0
        assert cli(["stop", str(run), "--yes"]) == 0
        assert cli(["requeue", str(run), "--suspend"]) == 0
    finally:
        os.umask(old)
    rd = RunDir(run)
    files = [*rd.inbox.iterdir(), rd.settings, rd.root / control.SETTINGS_LOCK]
    assert len(files) == 5
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    for f in rd.inbox.iterdir():
        cmd = control.read_command(f)
        assert (cmd.author, cmd.host) == (user, host)
    assert control.read_settings(run).updated_by == f"{user}@{host}"
    capsys.readouterr()
    assert cli(["status", str(run)]) == 0
    assert capsys.readouterr().out.count(f"by {user}@{host}") == 3

    for f in rd.inbox.iterdir():
        f.unlink()
    control.update_settings(run, requeue_suspended=False)
    anonymous = b'{"command":"save_now","v":1,"id":"anon","t":1.0}\n'
    (rd.inbox / "anon.json").write_bytes(anonymous)
    with Monitor(run, install_signals=False, poll_interval_s=1e-9, agree_interval_s=1e-9) as m:
        m.step(1)
    (rejected,) = faults.Replay.of(run).of_kind(CommandRejected)
    assert rejected.command_id == "anon" and "author" in rejected.reason
