"""The event writer: whole lines, one writer per file, durable where it matters."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import msgspec
import pytest

from ckptdash import events
from ckptdash.errors import EventValidationError
from ckptdash.rundir.writer import EventWriter


def read_lines(path: Path) -> list[dict[str, object]]:
    return [msgspec.json.decode(line) for line in path.read_bytes().splitlines()]


def test_emit_fills_the_envelope(tmp_path: Path) -> None:
    """emit() stamps run id, attempt, rank, host, time and version on every event."""
    with EventWriter(tmp_path, attempt=4, rank=2, host="n9") as w:
        w.emit(events.Heartbeat, step=11, epoch=1, metrics={"loss": 0.5})
    (line,) = read_lines(w.path)
    assert line["attempt"] == 4 and line["rank"] == 2 and line["host"] == "n9"
    assert line["v"] == 1 and line["step"] == 11 and line["metrics"] == {"loss": 0.5}
    assert isinstance(line["t"], float) and line["run"] == w.run_id


def test_invalid_event_writes_nothing(tmp_path: Path) -> None:
    """An invalid event raises before a byte reaches the log."""
    with (
        EventWriter(tmp_path, attempt=0) as w,
        pytest.raises(EventValidationError, match="trigger"),
    ):
        w.emit(
            events.CheckpointSaved,
            path="a",
            trigger="sometimes",
            size_bytes=1,
            duration_s=0.1,
        )
    assert w.path.read_bytes() == b""


def test_two_writers_never_share_a_file(tmp_path: Path) -> None:
    """Two writers of the same attempt and rank in one process still get separate files."""
    with EventWriter(tmp_path, attempt=0) as a, EventWriter(tmp_path, attempt=0) as b:
        assert a.path != b.path
        a.emit(events.RunFinished)
        b.emit(events.RunFinished)
    assert len(read_lines(a.path)) == len(read_lines(b.path)) == 1


def test_threads_write_whole_lines(tmp_path: Path) -> None:
    """Eight threads writing at once produce only whole, parseable lines, none lost."""
    with EventWriter(tmp_path, attempt=0) as w:

        def work(n: int) -> None:
            for i in range(500):
                w.emit(events.Heartbeat, step=n * 1000 + i, metrics={"x": float(i)})

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    steps = sorted(int(line["step"]) for line in read_lines(w.path))  # type: ignore[call-overload]
    assert steps == sorted(n * 1000 + i for n in range(8) for i in range(500))


def test_durable_kinds_are_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint_saved event is fsync'ed before write() returns; a heartbeat is not."""
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    with EventWriter(tmp_path, attempt=0) as w:
        synced.clear()
        w.emit(events.Heartbeat, step=1)
        assert synced == []
        w.emit(
            events.CheckpointSaved, step=1, path="a", trigger="api", size_bytes=1, duration_s=0.0
        )
        assert len(synced) == 1


def test_closed_writer_refuses(tmp_path: Path) -> None:
    """Writing after close is an error that names the file, not a silent drop."""
    w = EventWriter(tmp_path, attempt=0)
    w.close()
    with pytest.raises(ValueError, match="closed"):
        w.emit(events.RunFinished)
