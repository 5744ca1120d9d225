"""A forged checkpoint record never becomes "recorded", and loading never unpickles code
(issue 11, finding 7)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from ckptdash import Monitor, choose_resume, control
from ckptdash.cli import main as cli
from ckptdash.dash.feed.follow import RunFollower
from ckptdash.events import CheckpointSaved, encode
from ckptdash.rundir import RunDir
from ckptdash.rundir.hashing import checksum_file
from ckptdash.state.reading import load_state
from ckptdash.tail import RunTailer


class _Boom:
    """Unpickling this runs code: the marker file appears."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def _monitor(run: Path, **options: Any) -> Monitor:
    return Monitor(run, install_signals=False, **options)


def _forge(run: Path, name: str, path: Path, *, step: int, run_id: str, attempt: int = 0) -> None:
    """Append a checkpoint_saved line with a matching size and checksum to events/NAME."""
    size, checksum = checksum_file(path)
    ev = CheckpointSaved(
        t=2e9, run=run_id, attempt=attempt, step=step, path=str(path), trigger="signal",
        size_bytes=size, duration_s=0.1, checksum=checksum,
    )  # fmt: skip
    with open(RunDir(run).events / name, "ab") as f:
        f.write(encode(ev))


def test_forged_records_are_invalid_never_chosen_or_pinnable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Records naming a file outside the run directory (even in a correctly named file with
    the right run id), carrying another run's id, or sitting in a file named for another
    attempt are reported invalid with the reason; the resume rule keeps the run's own
    checkpoint, a pin on a forged path is refused, and nothing unpickles the payload."""
    run, marker = tmp_path / "run", tmp_path / "pwned"
    with _monitor(run) as monitor:
        monitor.step(1)
        own = monitor.save({"step": 1})
        assert own is not None
    run_id = RunDir(run).info().run_id
    outside = tmp_path / "elsewhere" / "x.pkl"
    outside.parent.mkdir()
    outside.write_bytes(pickle.dumps({"step": 99, "x": _Boom(marker)}))
    inside = RunDir(run).checkpoints / "forged.ckpt"
    inside.write_bytes(outside.read_bytes())
    _forge(run, "A0000.R0000.evil.1.jsonl", outside, step=99, run_id=run_id)
    _forge(run, "A0000.R0000.evil.2.jsonl", inside, step=98, run_id="someone-else")
    _forge(run, "A0007.R0000.evil.3.jsonl", inside, step=97, run_id=run_id, attempt=0)

    state = load_state(run)
    assert state.checkpoints[str(outside)].status == "invalid"
    assert "outside the run directory" in state.checkpoints[str(outside)].reason
    assert str(inside) not in state.checkpoints  # the other two never counted as records
    details = " | ".join(b.detail for b in state.bad_lines.samples)
    assert "is not this run" in details and "file named for attempt 7" in details
    assert [c.path for c in state.valid_checkpoints()] == [own.path]
    assert choose_resume(run).path == own.path
    with RunFollower(run, mode="poll", poll_interval_s=0.05) as follower:  # the dashboard's view
        assert follower.wait_loaded(30) and follower.latest is not None
        shown = {c.path: c.status for c in follower.latest.runs[0].checkpoints}
    assert shown == {own.path: "saved", str(outside): "invalid"}

    assert cli(["resume", str(run), "--pin", str(outside)]) != 0
    control.update_settings(run, resume_pin=str(outside))
    with _monitor(run) as monitor:
        assert monitor.load()["step"] == 1
    assert not marker.exists()
    assert cli(["status", str(run)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "x.pkl" in line]
    assert any(" invalid " in row for row in rows)


def test_a_declared_checkpoint_folder_outside_the_run_counts(tmp_path: Path) -> None:
    """Checkpoints the run saves in its own folder outside the run directory
    (``checkpoint_dir``) count: the folder is declared at start and on save, once per
    attempt, and the next attempt resumes from it."""
    from ckptdash.events import CheckpointDirDeclared  # new in issue 11

    run, scratch = tmp_path / "run", tmp_path / "scratch" / "ckpts"
    with _monitor(run, checkpoint_dir=scratch) as monitor:
        monitor.step(5)
        saved = monitor.save({"step": 5})
        assert saved is not None and Path(saved.path).parent == scratch
    with _monitor(run, checkpoint_dir=scratch) as monitor:
        assert monitor.load()["step"] == 5
    declared = [
        e
        for b in RunTailer(run).batches()
        for e in b.events
        if isinstance(e, CheckpointDirDeclared)
    ]
    assert [(e.attempt, e.path) for e in declared] == [(0, str(scratch)), (1, str(scratch))]


def test_monitor_load_never_unpickles_code_by_default(tmp_path: Path) -> None:
    """Someone with write access to the run directory swaps a recorded checkpoint for a
    malicious pickle and records it properly: ``Monitor.load()`` refuses to unpickle it
    (weights_only) and the code never runs; plain tensors-and-numbers checkpoints load."""
    import torch

    run, marker = tmp_path / "run", tmp_path / "pwned"
    with _monitor(run) as monitor:
        monitor.step(1)
        monitor.save({"step": 1, "w": torch.ones(2)})
    with _monitor(run) as monitor:
        assert monitor.load()["w"].tolist() == [1.0, 1.0]
    evil = RunDir(run).checkpoints / "step=9.ckpt"
    evil.write_bytes(pickle.dumps({"step": 9, "x": _Boom(marker)}))
    _forge(run, "A0000.R0000.evil.1.jsonl", evil, step=9, run_id=RunDir(run).info().run_id)
    assert choose_resume(run).path == str(evil)  # it validates: only loading can refuse it
    with _monitor(run) as monitor, pytest.raises(pickle.UnpicklingError):
        monitor.load()
    assert not marker.exists()
