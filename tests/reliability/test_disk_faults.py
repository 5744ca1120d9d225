"""A full disk, a permission error or a read-only run directory during a save or an event
write: a clear error, training state intact, the previous checkpoint still the resume choice.

Real failures, not mocks: a small tmpfs that fills up, a folder owned by ``nobody`` that
the job itself makes read-only, a read-only bind mount (root ignores permissions, not
``EROFS``). These need root, which CI has; elsewhere they skip.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from ckptdash import Monitor, control, resume_path
from ckptdash.cli import main as cli
from ckptdash.errors import AtomicWriteError, EventWriteError, RunDirError
from ckptdash.events import CheckpointFailed, CommandRejected, Heartbeat, RunStarted
from ckptdash.rundir.writer import EventWriter
from tests.reliability import faults


def _monitor(run: Path) -> Monitor:
    return Monitor(run, install_signals=False, poll_interval_s=1e-6, agree_interval_s=1e-6)


def _tensor(mib: float) -> torch.Tensor:
    return torch.zeros(int(mib * (1 << 20)) // 4)


def _temp_files(folder: Path) -> set[str]:
    return faults.temp_files(folder)


def test_disk_full_during_a_save_keeps_the_previous_checkpoint(small_disk: Any) -> None:
    """On a 2 MiB disk a 256 KiB save succeeds and an 8 MiB save fails with
    AtomicWriteError (ENOSPC, "the previous file is intact"), recorded as
    ``checkpoint_failed`` naming the cause; no partial file or temp file is left; the resume
    rule still picks step 1 and it loads. A save ordered by a command that fails rejects the
    command with the reason. Training goes on: the next save that fits succeeds."""
    run = small_disk(2048) / "run"
    monitor = _monitor(run)
    folder = monitor.config.checkpoint_path
    monitor.step(1)
    first = monitor.save({"w": _tensor(0.25), "step": 1})
    assert first is not None

    monitor.step(2)
    with pytest.raises(AtomicWriteError) as full:
        monitor.save({"w": _tensor(8), "step": 2})
    assert full.value.errno == errno.ENOSPC and "previous file is intact" in str(full.value)

    cmd = control.issue(run, "save_now")
    monitor.step(3)
    assert monitor.should_save
    with pytest.raises(AtomicWriteError):
        monitor.save({"w": _tensor(8), "step": 3})

    replay = faults.Replay.of(run)
    failed = replay.of_kind(CheckpointFailed)
    assert [f.step for f in failed] == [2, 3]
    assert all("No space left on device" in f.error for f in failed)
    (rejected,) = replay.of_kind(CommandRejected)
    assert rejected.command_id == cmd.id and "save failed" in rejected.reason
    assert sorted(os.listdir(folder)) == ["step=1.ckpt"] and not _temp_files(folder)
    assert resume_path(run) == first.path
    assert torch.load(first.path, weights_only=True)["step"] == 1
    assert replay.bad == []

    monitor.step(4)
    assert monitor.save({"w": _tensor(0.25), "step": 4}) is not None
    assert resume_path(run) == str(folder / "step=4.ckpt")
    monitor.close()


def _fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte with one file; returns it (delete it to free the space)."""
    filler = disk / "filler"
    error = None
    with open(filler, "wb", buffering=0) as f:
        while error is None:
            try:
                f.write(b"\0" * 4096)
            except OSError as exc:
                error = exc.errno
    assert error == errno.ENOSPC
    return filler


def test_disk_full_during_an_event_write_raises_and_leaves_no_half_line(
    small_disk: Any,
) -> None:
    """The disk fills while the log's last page has room for part of the next line: that
    write fails with EventWriteError (ENOSPC, naming the file and the fix) and the part
    that did reach the file is cut back, so the log still ends on a whole line. Once space
    is freed the writer carries on and every line of the log reads."""
    disk = small_disk(1024)
    writer = EventWriter(disk / "run", attempt=0, host="h")
    writer.emit(RunStarted, pid=1)
    writer.emit(Heartbeat, step=1, metrics={"loss": 1.0})
    before = writer.path.stat().st_size
    assert before % 4096 != 0  # the last page has room: the failing write will be partial
    filler = _fill(disk)
    big = {f"m{i}": float(i) for i in range(2000)}  # one line of ~30 KB, more than a page
    with pytest.raises(EventWriteError) as full:
        writer.emit(Heartbeat, step=2, metrics=big)
    assert full.value.errno == errno.ENOSPC
    assert str(writer.path) in str(full.value) and "Free space" in str(full.value)
    assert writer.path.stat().st_size == before
    assert writer.path.read_bytes().endswith(b"\n")
    filler.unlink()
    writer.emit(Heartbeat, step=3, metrics=big)
    writer.close()
    replay = faults.Replay.of(disk / "run")
    assert replay.bad == [] and [e.step for e in replay.of_kind(Heartbeat)] == [1, 3]


def test_a_fragment_that_cannot_be_cut_back_stays_one_bad_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If even cutting back fails, the fragment is closed off by a newline before the next
    event: readers count one corrupt line and read every event after it."""
    writer = EventWriter(tmp_path / "run", attempt=0, host="h")
    writer.emit(RunStarted, pid=1)
    real_write = os.write
    calls = {"n": 0}

    def half_then_full(fd: int, data: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    monkeypatch.setattr(os, "ftruncate", lambda fd, size: (_ for _ in ()).throw(OSError(5, "EIO")))
    with pytest.raises(EventWriteError):
        writer.emit(Heartbeat, step=2)
    monkeypatch.undo()
    writer.emit(Heartbeat, step=3)
    writer.close()
    replay = faults.Replay.of(tmp_path / "run")
    assert len(replay.bad) == 1 and "corrupt" in replay.bad[0]
    assert [e.step for e in replay.of_kind(Heartbeat)] == [3]


def test_permission_denied_on_the_checkpoint_folder_and_the_event_folder(
    nobody_dir: Path,
) -> None:
    """A job running as ``nobody`` whose checkpoint folder became read-only: the save fails
    with AtomicWriteError ("cannot create a temp file … Permission denied"), recorded as
    ``checkpoint_failed``; step 1 stays the resume choice. A job whose events folder is
    read-only does not start: RunDirError names the folder and the fix."""
    run, out = nobody_dir / "run", nobody_dir / "out.json"
    proc = faults.context().Process(target=faults.unprivileged_saves, args=(str(run), str(out)))
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0
    result = json.loads(out.read_text())
    assert result["save"].startswith("AtomicWriteError") and "Permission denied" in result["save"]
    assert result["start"].startswith("RunDirError") and "Permission denied" in result["start"]
    assert "events" in result["start"] and "run_dir you can" in result["start"]
    (failed,) = faults.Replay.of(run).of_kind(CheckpointFailed)
    assert failed.step == 2 and "Permission denied" in failed.error
    assert resume_path(run) == str(run / "checkpoints" / "step=1.ckpt")


def test_read_only_checkpoint_folder_and_run_directory(
    tmp_path: Path, read_only: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint folder remounted read-only under a running job (EROFS, which root cannot
    override): the save fails with AtomicWriteError, recorded as ``checkpoint_failed``, and
    step 1 stays the resume choice. A whole run directory read-only: a new job refuses to
    start with RunDirError ("Read-only file system"), while ``resume_path`` and
    ``ckptdash status`` still read it."""
    run = tmp_path / "run"
    monitor = _monitor(run)
    monitor.step(1)
    first = monitor.save({"step": 1})
    assert first is not None
    read_only(monitor.config.checkpoint_path)
    monitor.step(2)
    with pytest.raises(AtomicWriteError) as ro:
        monitor.save({"step": 2})
    assert ro.value.errno == errno.EROFS
    monitor.close()
    (failed,) = faults.Replay.of(run).of_kind(CheckpointFailed)
    assert "Read-only file system" in failed.error
    assert resume_path(run) == first.path

    read_only(run)
    with pytest.raises(RunDirError, match="Read-only file system"):
        Monitor(run, install_signals=False)
    assert resume_path(run) == first.path
    assert cli(["status", str(run)]) == 0
    assert "step=1.ckpt" in capsys.readouterr().out
