"""The run set: the runs of a folder found, opened, read, rested and woken in one place, for
the dashboard's follower, ``ckptdash watch`` and ``ckptdash status`` alike."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ckptdash.errors import RunDirError
from ckptdash.events import Heartbeat
from ckptdash.rundir import RunDir
from ckptdash.rundir.writer import EventWriter
from ckptdash.state.runset import OpenRun, RunSet

T0 = 1_764_430_000.0


def beat(root: Path, step: int) -> None:
    with EventWriter(root, attempt=0) as w:
        w.emit(Heartbeat, step=step, t=T0 + step)


def steps(runs: RunSet) -> dict[str, int | None]:
    out = {}
    for run in runs.poll():
        p = run.state.progress
        out[run.rd.root.name] = None if p is None else p.step
    return out


class Idle:
    """A policy under which every run is idle: it rests after each read, kept as its root."""

    check_every_s = 0.0

    def may_rest(self, run: OpenRun) -> bool:
        return True

    def keep(self, run: OpenRun) -> object:
        return f"kept {run.rd.root.name}"


def test_a_folder_s_runs_are_read_and_new_ones_join(tmp_path: Path) -> None:
    """Each run below the folder is read; a run that appears joins at the next discovery; a
    folder emptied for a moment raises at discovery and the set keeps what it has."""
    beat(tmp_path / "a", 1)
    beat(tmp_path / "b", 2)
    runs = RunSet(tmp_path)
    assert [r.rd.root.name for r in runs.discover()] == ["a", "b"]
    assert runs.is_folder and steps(runs) == {"a": 1, "b": 2}
    beat(tmp_path / "c", 3)
    beat(tmp_path / "a", 4)
    assert [r.rd.root.name for r in runs.discover()] == ["c"]
    assert steps(runs) == {"a": 4, "b": 2, "c": 3}
    for name in ("a", "b", "c"):
        shutil.rmtree(tmp_path / name)
    with pytest.raises(RunDirError, match="holds no ckptdash run"):
        runs.discover()
    assert len(runs) == 3


def test_a_lone_run_never_rests(tmp_path: Path) -> None:
    """A run directory itself is a set of one, and rests under no policy: there is nothing to
    save."""
    beat(tmp_path, 1)
    runs = RunSet(tmp_path, rest=Idle())
    runs.discover()
    assert not runs.is_folder
    (run,) = list(runs.poll())
    assert not runs.settle(run) and list(runs.open) == [str(tmp_path)]


def test_strict_leaves_out_a_run_whose_run_json_cannot_be_read(tmp_path: Path) -> None:
    """``ckptdash status``'s set: a run with an unreadable run.json is in ``broken`` with the
    reason and the others are read; a follower's (not strict) opens it with the run id ""."""
    beat(tmp_path / "a", 1)
    beat(tmp_path / "b", 2)
    (tmp_path / "b" / "run.json").write_text("{not json")
    strict = RunSet(tmp_path, strict=True)
    strict.discover()
    assert steps(strict) == {"a": 1}
    rd, why = strict.broken[str(tmp_path / "b")]
    assert rd.root == tmp_path / "b" and "run.json" in why
    lenient = RunSet(tmp_path)
    lenient.discover()
    assert set(steps(lenient)) == {"a", "b"} and not lenient.broken


def test_idle_runs_rest_and_wake_when_their_files_change_or_when_focused(
    tmp_path: Path,
) -> None:
    """Under a policy that calls them idle, read runs rest as what it keeps; one whose files
    change is opened again (handing back what was kept, read to its end), and a focused one at
    once whether or not anything changed."""
    beat(tmp_path / "a", 1)
    beat(tmp_path / "b", 2)
    runs = RunSet(tmp_path, rest=Idle(), clock=lambda: T0 + 99)
    runs.discover()
    assert all(runs.settle(run) for run in runs.poll()) and not runs.open
    assert {os.path.basename(k): v.kept for k, v in runs.resting.items()} == {
        "a": "kept a",
        "b": "kept b",
    }
    assert steps(runs) == {}  # nothing changed: both stay at rest
    beat(tmp_path / "a", 5)
    (woken,) = list(runs.poll())
    assert woken.rd.root.name == "a" and woken.state.progress is not None
    assert woken.state.progress.step == 5
    assert woken.woken_from == "kept a" and woken.awake_since == T0 + 99
    assert runs.settle(woken)  # idle again, by this policy
    (focused,) = list(runs.poll(focused={str(tmp_path / "b")}))
    assert focused.rd.root.name == "b" and focused.seen is None  # focused: it may not rest
    assert not runs.settle(focused)
    assert sorted(runs.roots_of([str(tmp_path / "b" / "events" / "x.jsonl")]) or ()) == [
        str(tmp_path / "b")
    ]
    assert runs.roots_of([str(tmp_path / "new-run")]) is None  # maybe a new run: read all


def test_a_run_set_opens_from_the_snapshot_and_leaves_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run read at length leaves a snapshot, and the next set opens from it: it covers the
    log read, and the state is the same."""
    from ckptdash.state import snapshot

    monkeypatch.setattr(snapshot, "SNAPSHOT_AFTER_BYTES", 0)
    for step in range(5):
        beat(tmp_path / "a", step)
    first = RunSet(tmp_path)
    first.discover()
    (run,) = list(first.poll())
    assert run.covered > 0
    again = RunSet(tmp_path)
    (opened,) = again.discover()
    assert opened.covered == run.covered
    assert next(again.poll()).state.to_dict() == run.state.to_dict()
    assert isinstance(opened.rd, RunDir)
