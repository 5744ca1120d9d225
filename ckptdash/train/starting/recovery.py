"""What a crashed attempt leaves behind, settled by the next one with an event each.

A ``kill -9``, an OOM kill or a node failure can stop an attempt anywhere.
When the next attempt starts — and only after :class:`~ckptdash.train.starting.guard.RunGuard`
has established that no other job writes to the run directory — rank 0 settles:

* **Commands left in** ``control/claimed/``: claimed, never moved to ``done/``.
  Without an outcome in the log they are answered ``command_expired`` (or
  ``command_rejected`` with the reason, when the file is malformed). If the
  log already holds the outcome (the claimer died between writing it and the
  move), the file is only moved: a command keeps its one outcome, and a save
  that was applied is never reported as expired.
* **Saves that never ended**: the log's latest event for a path is
  ``checkpoint_started`` from before this attempt. Each gets
  ``checkpoint_failed`` saying it was interrupted. If that save had already
  renamed its file into place, the file is not what the log records, so the
  resume rule skips it (and says so); a previous record of that path stays
  valid as long as its file still matches it.
* **Temp files** ``.ckptdash-tmp-<name>.<pid>.<random>`` of interrupted atomic
  writes of a checkpoint path this run's log mentions, last modified before
  this attempt started and not belonging to a process still running on this
  host: deleted, and named with their size in the ``checkpoint_failed`` of
  their save (or in a ``checkpoint_removed`` when no interrupted save accounts
  for them, e.g. an earlier interrupted save of a path saved again since). A
  large checkpoint killed mid-write would otherwise leave gigabytes behind at
  every preemption. Temp files of paths the log never mentions are left alone:
  they may belong to another run sharing the folder.

Readers never needed any of this to stay correct (temp files and unrecorded
files are never resume candidates); it makes the history complete — every
claimed command and every started save ends with an outcome — and frees the space.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ckptdash import control
from ckptdash.errors import CkptDashError
from ckptdash.events import (
    CheckpointFailed,
    CheckpointRemoved,
    CheckpointStarted,
    CommandExpired,
    CommandRejected,
    ControlFailed,
)
from ckptdash.rundir import TEMP_PREFIX, RunDir
from ckptdash.rundir.process import process_alive
from ckptdash.rundir.writer import EventWriter
from ckptdash.train.starting.logview import LogView

_ANSWERED: Final = frozenset({"applied", "rejected", "expired"})


@dataclass(frozen=True, slots=True)
class TempFile:
    """A leftover temp file that was removed: where, how big, and which save it belonged to."""

    path: Path
    size_bytes: int
    target: Path
    pid: int | None


def recover(
    run: RunDir,
    writer: EventWriter,
    view: LogView,
    *,
    attempt: int,
    started_at: float,
    complete: Callable[[control.Claimed], None],
) -> None:
    """Settle what earlier attempts left unanswered (rank 0, right after ``run_started``).

    ``writer`` records each outcome; ``attempt`` and ``started_at`` are this attempt's
    number and start: only leftovers older than it are touched. ``complete`` moves an
    answered command to ``done/`` (reporting, not raising, when it cannot).
    """
    try:
        left = control.orphans(run)
    except (CkptDashError, OSError) as exc:  # claimed/ a link or another account's: say why
        left = []
        reason = control.safe_name(f"cannot settle the commands left in claimed/: {exc}")
        warnings.warn(f"ckptdash: {reason}", RuntimeWarning, stacklevel=2)
        writer.emit(ControlFailed, reason=reason)
    for orphan in left:
        known = view.state.commands.get(orphan.id)
        if known is not None and known.status in _ANSWERED:
            pass  # its outcome is in the log already: only the move to done/ was missing
        elif orphan.error is not None:  # malformed whoever claimed it: say why
            writer.emit(CommandRejected, command_id=orphan.id, command="", reason=orphan.error)
        else:
            writer.emit(
                CommandExpired,
                command_id=orphan.id,
                command=orphan.command_name,
                reason="claimed by an attempt that ended before answering it",
            )
        complete(orphan)

    # Only where this run keeps checkpoints: a stray record must not make us delete elsewhere.
    targets = {os.path.abspath(p) for p in view.checkpoints if not view.state.outside(p)}
    removed = remove_temp_files({Path(p).parent for p in targets}, targets, before=started_at)
    by_target: dict[str, list[TempFile]] = {}
    for tmp in removed:
        by_target.setdefault(os.path.abspath(tmp.target), []).append(tmp)

    for path, ev in sorted(view.checkpoints.items()):
        if not isinstance(ev, CheckpointStarted) or ev.t >= started_at or view.state.outside(path):
            continue
        temps = by_target.pop(os.path.abspath(path), [])
        error = (
            f"interrupted: attempt {ev.attempt} ended during this save without recording its"
            " outcome (killed, or its node failed)"
        )
        if temps:
            error += "; removed its temp file " + _names(temps)
        writer.emit(CheckpointFailed, step=ev.step, path=path, trigger=ev.trigger, error=error)
    for temps in by_target.values():
        for tmp in temps:
            _report_unclaimed(writer, attempt, tmp)


def remove_temp_files(
    folders: Iterable[Path], targets: set[str], *, before: float
) -> list[TempFile]:
    """Delete ckptdash temp files in ``folders`` whose target (an absolute path) is in
    ``targets`` and that were last modified before ``before``.

    Skipped: files of this process, of a process still running on this host
    (it may be writing), anything that is not a regular file, and folders that
    do not exist or cannot be read. Returns what was deleted.
    """
    out: list[TempFile] = []
    me = os.getpid()
    for folder in sorted(set(folders)):
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in sorted(entries, key=lambda e: e.name):
            if not entry.name.startswith(TEMP_PREFIX):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
                # A directory: the target of an interrupted Monitor.saving() (shards).
                is_dir = entry.is_dir(follow_symlinks=False)
                if not (is_dir or entry.is_file(follow_symlinks=False)) or st.st_mtime >= before:
                    continue
            except OSError:
                continue
            target, pid = _parse_temp_name(entry.name)
            if target is None or os.path.abspath(Path(folder) / target) not in targets:
                continue  # not a save this run recorded: maybe another run's
            if pid == me or (pid is not None and process_alive(pid, st.st_mtime)):
                continue
            size = _tree_size(Path(entry.path)) if is_dir else st.st_size
            try:
                if is_dir:
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
            except OSError:
                continue
            out.append(
                TempFile(
                    Path(entry.path),
                    size,
                    Path(folder) / target,
                    pid,
                )
            )
    return out


def _tree_size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _parse_temp_name(name: str) -> tuple[str | None, int | None]:
    """``.ckptdash-tmp-<target>.<pid>.<hex>`` → (target, pid); (None, None) if not that shape."""
    parts = name[len(TEMP_PREFIX) :].rsplit(".", 2)
    if len(parts) == 3 and parts[0] and parts[1].isdigit():
        return parts[0], int(parts[1])
    return None, None


def _names(temps: list[TempFile]) -> str:
    return ", ".join(f"{t.path.name} ({t.size_bytes} bytes)" for t in temps)


def _report_unclaimed(writer: EventWriter, attempt: int, tmp: TempFile) -> None:
    writer.emit(
        CheckpointRemoved,
        path=str(tmp.path),
        reason=f"leftover temp file of an interrupted write ({tmp.size_bytes} bytes,"
        f" pid {tmp.pid if tmp.pid is not None else '?'}); removed when attempt"
        f" {attempt} started",
    )
