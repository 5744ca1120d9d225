"""The one save path: atomic, checksummed, and recorded with its trigger.

``checkpoint_started`` → atomic write (same-directory temp, fsync, rename,
fsync dir; checksum computed while writing) → ``checkpoint_saved`` (fsync'ed).
Only after that event is durable does the checkpoint exist for ckptdash.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ckptdash.errors import EventWriteError
from ckptdash.events import CheckpointFailed, CheckpointSaved, CheckpointStarted, Trigger
from ckptdash.rundir import atomic_write, fsync_dir, manifest
from ckptdash.rundir.door import fsync_saved, make_folders
from ckptdash.rundir.hashing import checksum_file
from ckptdash.rundir.writer import EventWriter

META_KEY = "ckptdash"


@dataclass(frozen=True)
class Written:
    """What a write that other code did left: its size and checksum, and where it went
    when that is not the path it was handed (``written_at``), or why nobody can tell."""

    size_bytes: int
    checksum: str
    written_at: str | None = None
    unvalidated: str | None = None


def torch_writer(obj: Any) -> Callable[[IO[bytes]], None]:
    """A content callable for :func:`atomic_write` that ``torch.save``s ``obj``."""
    import torch

    def write(f: IO[bytes]) -> None:
        torch.save(obj, f)

    return write


def record_save(
    writer: EventWriter | None,
    path: str | os.PathLike[str],
    *,
    trigger: Trigger,
    step: int | None,
    epoch: int | None,
    write: Callable[[], tuple[int, str] | Written],
    announce: bool = True,
    began: float | None = None,
    blocking_s: float | None = None,
    monitored: dict[str, float] | None = None,
    artifact: str | None = None,
) -> CheckpointSaved | None:
    """Run ``write`` (returns size and checksum, or a :class:`Written`) between a started and
    a saved/failed event.

    ``announce=False``: the ``checkpoint_started`` was already written (before the other
    code began writing, so that a kill during the write is known to the next attempt).
    ``artifact``: why the checkpoint cannot resume training (weights only, an export), None
    when it can (recorded as the event's ``artifact``).
    An asynchronous save (:mod:`ckptdash.train.checkpoints.async_save`) announced itself when it was
    staged, passes that moment as ``began`` (a ``perf_counter`` reading, so
    ``duration_s`` runs from the call to durable) and its stall as ``blocking_s``.

    Without a writer (ranks other than 0 when they write no events) the save just runs.
    Re-raises the write's error after recording ``checkpoint_failed`` (if even that
    cannot be written, e.g. on a full disk, a warning says so and the write's own
    error is raised).
    """
    spath = os.fspath(path)
    if writer is not None and announce:
        writer.emit(CheckpointStarted, step=step, path=spath, trigger=trigger)
    if began is None:
        began = time.perf_counter()
    try:
        result = write()
    except BaseException as exc:
        if writer is not None:
            try:
                writer.emit(
                    CheckpointFailed, step=step, path=spath, trigger=trigger, error=_describe(exc)
                )
            except EventWriteError as log_exc:  # the same full disk: keep the save's own error
                warnings.warn(
                    f"ckptdash: the failed save of {spath} could not be recorded: {log_exc}",
                    RuntimeWarning,
                    stacklevel=2,
                )
        raise
    duration = time.perf_counter() - began
    if writer is None:
        return None
    written = result if isinstance(result, Written) else Written(*result)
    where = {} if written.written_at is None else {"written_at": written.written_at}
    if written.unvalidated is not None:
        where["unvalidated"] = written.unvalidated
    event = writer.emit(
        CheckpointSaved,
        step=step,
        path=spath,
        trigger=trigger,
        size_bytes=written.size_bytes,
        duration_s=duration,
        checksum=written.checksum,
        epoch=epoch,
        **({} if blocking_s is None else {"blocking_s": blocking_s}),
        **({} if not monitored else {"monitored": monitored}),
        **({} if not artifact else {"artifact": artifact}),
        **where,
    )
    assert isinstance(event, CheckpointSaved)
    return event


def save_atomic(
    writer: EventWriter | None,
    obj: Any,
    path: str | os.PathLike[str],
    *,
    trigger: Trigger,
    step: int | None,
    epoch: int | None = None,
    monitored: dict[str, float] | None = None,
    artifact: str | None = None,
) -> CheckpointSaved | None:
    """``torch.save(obj, path)`` atomically, with the checksum computed while writing."""
    target = Path(path)
    make_folders(target.parent)

    def write() -> tuple[int, str]:
        result = atomic_write(target, torch_writer(obj))
        return result.size_bytes, result.checksum

    return record_save(
        writer,
        target,
        trigger=trigger,
        step=step,
        epoch=epoch,
        write=write,
        monitored=monitored,
        artifact=artifact,
    )


def durable_existing(path: str | os.PathLike[str]) -> tuple[int, str]:
    """Fsync a file (or every file of a directory checkpoint) someone else wrote; size + checksum.

    Used when a custom CheckpointIO did the writing: the checksum needs one read.
    A sharded checkpoint (a directory) gets a manifest of every file written into it
    (:mod:`ckptdash.rundir.manifest`); its size is the files' total, its checksum the manifest's.
    """
    p = Path(path)
    if p.is_dir():
        return manifest.write(p)
    fsync_saved(p)
    fsync_dir(p.parent)
    return checksum_file(p)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]
