"""What a killed attempt leaves behind is settled by the next one, each with an event.

The kill tests reach these states at random; these tests build each one on purpose.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ckptdash import Monitor, control
from ckptdash.events import (
    CheckpointFailed,
    CheckpointRemoved,
    CheckpointStarted,
    CommandApplied,
    CommandExpired,
    CommandReceived,
    CommandRejected,
    RunStarted,
)
from ckptdash.rundir import TEMP_PREFIX, RunDir
from ckptdash.rundir.writer import EventWriter
from tests.reliability import faults

DEAD_PID = 2**22 + 12345  # above the default pid_max: no process has it


def _dead_attempt(run: Path) -> EventWriter:
    w = EventWriter(run, attempt=0, host="node99")
    w.emit(RunStarted, t=time.time() - 3600, pid=DEAD_PID)
    return w


def test_claimed_commands_get_one_outcome_whatever_step_the_crash_interrupted(
    tmp_path: Path,
) -> None:
    """Three commands were claimed by an attempt that died: one before any event (answered
    ``command_expired``), one malformed (answered ``command_rejected`` with the reason),
    one after its ``command_applied`` was written but before the move to done/ (only
    moved — it keeps its single outcome, it is not reported expired as well)."""
    run = tmp_path / "run"
    w = _dead_attempt(run)
    silent = control.issue(run, "save_now")
    applied = control.issue(run, "save_now")
    (RunDir(run).inbox / "bad.json").write_bytes(b"{not json")
    claimed = {c.id: c for c in control.claim(run)}
    assert set(claimed) == {silent.id, applied.id, "bad"}
    t = time.time() - 3000
    w.emit(CommandReceived, t=t, command_id=applied.id, command="save_now")
    w.emit(CommandApplied, t=t, command_id=applied.id, command="save_now", detail="x.ckpt")
    w.close()

    Monitor(run, install_signals=False, stale_after_s=1).close()
    replay = faults.Replay.of(run)
    outcomes = {
        e.command_id: e for e in replay.of_kind(CommandApplied, CommandExpired, CommandRejected)
    }
    assert len(replay.of_kind(CommandApplied, CommandExpired, CommandRejected)) == 3
    assert isinstance(outcomes[silent.id], CommandExpired)
    assert isinstance(outcomes[applied.id], CommandApplied)
    assert isinstance(outcomes["bad"], CommandRejected) and "bad.json" in outcomes["bad"].reason
    assert sorted(os.listdir(RunDir(run).done)) == sorted(f"{c}.json" for c in claimed)
    assert not os.listdir(RunDir(run).claimed)


def test_an_interrupted_save_is_answered_and_its_temp_file_removed(tmp_path: Path) -> None:
    """A save that began and never ended (its attempt was killed while writing) gets
    ``checkpoint_failed`` saying it was interrupted and naming the temp file that was
    removed with its size. The temp file of an earlier interrupted save of a path that was
    saved again since is removed and reported by ``checkpoint_removed``. Left alone: a temp
    file newer than the attempt's start, one of a process still running on this host, and
    one for a path this run never recorded (it may be another run's)."""
    run = tmp_path / "run"
    folder = run / "checkpoints"
    w = _dead_attempt(run)
    old = time.time() - 3000
    target, last = folder / "step=7.ckpt", folder / "last.ckpt"
    w.emit(CheckpointStarted, t=old, step=7, path=str(target), trigger="signal")
    w.emit(CheckpointStarted, t=old, step=6, path=str(last), trigger="periodic")
    w.emit(CheckpointFailed, t=old, step=6, path=str(last), trigger="periodic", error="x")
    w.close()
    leftover = folder / f"{TEMP_PREFIX}step=7.ckpt.{DEAD_PID}.0a1b2c3d"
    stray = folder / f"{TEMP_PREFIX}last.ckpt.{DEAD_PID}.deadbeef"
    live = folder / f"{TEMP_PREFIX}step=7.ckpt.1.00000000"  # pid 1 runs since boot
    foreign = folder / f"{TEMP_PREFIX}other.ckpt.{DEAD_PID}.00000000"
    for f in (leftover, stray, live, foreign):
        f.write_bytes(b"x" * 1000)
        os.utime(f, (time.time() - 60, time.time() - 60))

    with Monitor(run, install_signals=False, stale_after_s=1):
        young = folder / f"{TEMP_PREFIX}step=7.ckpt.{DEAD_PID}.11111111"
        young.write_bytes(b"y")
    replay = faults.Replay.of(run)
    failed = [f for f in replay.of_kind(CheckpointFailed) if f.path == str(target)]
    assert len(failed) == 1 and failed[0].step == 7 and failed[0].trigger == "signal"
    assert failed[0].error.startswith("interrupted: attempt 0 ended during this save")
    assert f"{leftover.name} (1000 bytes)" in failed[0].error
    (removed,) = replay.of_kind(CheckpointRemoved)
    assert removed.path == str(stray) and "leftover temp file" in removed.reason
    assert not leftover.exists() and not stray.exists()
    assert live.exists() and young.exists() and foreign.exists()
    assert replay.state.checkpoints[str(target)].status == "failed"
