"""Saves written by someone else's code: published atomically into place, or recorded in place.

:func:`begin` → the caller writes a file or a directory at :attr:`PendingSave.temp`
(a name next to the target, agreed by every rank) → :func:`finish` on every
rank: the ranks agree that all of them succeeded, then the lead rank (0) makes
the result durable (fsync of every file, a manifest for a directory), renames it
onto the target and records ``checkpoint_saved``. If any rank failed, nothing is
published: the lead removes the temp and records ``checkpoint_failed``.

A kill between the two leaves ``.ckptdash-tmp-<name>.<pid>.<hex>`` (a file or
a directory) next to the target; the next attempt's recovery removes it, because
the log holds this save's ``checkpoint_started``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ckptdash.errors import SaveError
from ckptdash.events import CheckpointFailed, CheckpointSaved, CheckpointStarted, Trigger
from ckptdash.rundir import fsync_dir, manifest, temp_path_for
from ckptdash.rundir.door import make_folders
from ckptdash.train.engine import dist
from ckptdash.train.engine.session import Session


@dataclass(frozen=True)
class PendingSave:
    """A save in progress: where the caller writes, where it is published, and how it is named."""

    target: Path
    temp: Path
    trigger: Trigger
    step: int | None
    epoch: int | None
    began: float


def begin(session: Session, target: str | os.PathLike[str], trigger: Trigger) -> PendingSave:
    """Agree on a temp name next to ``target`` (collective) and record ``checkpoint_started``."""
    final = Path(os.path.abspath(target))
    temp = None
    if session.rank == 0:
        make_folders(final.parent)
        temp = temp_path_for(final)
        session.writer.emit(CheckpointStarted, step=session.step, path=str(final), trigger=trigger)
    temp = dist.broadcast_object(temp)
    assert temp is not None
    return PendingSave(final, temp, trigger, session.step, session.epoch, time.perf_counter())


def finish(
    session: Session, pending: PendingSave, error: BaseException | None
) -> CheckpointSaved | None:
    """Publish ``pending`` if no rank failed (collective); raise if it was not published.

    ``error`` is what this rank's writing code raised (None if it returned). A rank that
    did not fail itself gets a :class:`SaveError` when another rank failed, so that
    every rank leaves the save together.
    """
    failed = dist.agree_max([int(error is not None)])[0]
    outcome: str | None = None
    saved: CheckpointSaved | None = None
    if session.rank == 0:
        if failed:
            outcome = _describe(error) if error is not None else "the save failed on another rank"
            _abort(session, pending, outcome)
        else:
            try:
                saved = _publish(session, pending)
            except Exception as exc:
                outcome = _describe(exc)
                _abort(session, pending, outcome)
    outcome = dist.broadcast_object(outcome)
    if error is not None:
        raise error
    if outcome is not None:
        raise SaveError(f"{pending.target}: not saved ({outcome}); the previous file is intact")
    return saved


def finish_lead(
    session: Session, pending: PendingSave, error: BaseException | None
) -> CheckpointSaved | None:
    """:func:`finish` without collectives, for rank 0 once it knows every rank is done (a
    DCP async save's future on the coordinator); safe on a background thread. Other ranks
    do nothing. Raises :class:`SaveError` if it was not published."""
    if session.rank != 0:
        return None
    outcome = _describe(error) if error is not None else None
    if outcome is None:
        try:
            return _publish(session, pending)
        except Exception as exc:
            outcome = _describe(exc)
    _abort(session, pending, outcome)
    raise SaveError(f"{pending.target}: not saved ({outcome}); the previous file is intact")


def _publish(session: Session, pending: PendingSave) -> CheckpointSaved:
    temp, target = pending.temp, pending.target
    if temp.is_dir():
        size, checksum = manifest.write(temp)
    elif temp.is_file():
        size, checksum = manifest.hash_file(temp, fsync=True)
    else:
        raise FileNotFoundError(
            f"nothing was written to {temp}: write the checkpoint to the path that"
            " Monitor.saving() hands out"
        )
    replace_path(temp, target)
    event = session.writer.emit(
        CheckpointSaved,
        step=pending.step,
        path=str(target),
        trigger=pending.trigger,
        size_bytes=size,
        duration_s=time.perf_counter() - pending.began,
        checksum=checksum,
        epoch=pending.epoch,
    )
    assert isinstance(event, CheckpointSaved)
    return event


def replace_path(source: Path, target: Path) -> None:
    """Rename ``source`` onto ``target`` and make it durable. A file replaces a file
    atomically; an existing directory is first moved aside (readers briefly see no
    ``target``, never a mix) and deleted after the new one is in place."""
    aside = None
    if target.is_dir() and not target.is_symlink():
        aside = temp_path_for(target)
        os.rename(target, aside)
    try:
        os.replace(source, target)
    except BaseException:
        if aside is not None:
            os.rename(aside, target)
        raise
    fsync_dir(target.parent)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def _abort(session: Session, pending: PendingSave, error: str) -> None:
    remove(pending.temp)
    session.writer.emit(
        CheckpointFailed,
        step=pending.step,
        path=str(pending.target),
        trigger=pending.trigger,
        error=error,
    )


def remove(path: Path) -> None:
    """Delete a file or a directory tree; what is already gone is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]
