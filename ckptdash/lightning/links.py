"""Lightning's ``last.ckpt`` as what it is: a link to, or a copy of, a recorded checkpoint.

``ModelCheckpoint(save_last="link")`` keeps ``last.ckpt`` as a symbolic link to its newest
file, updated outside the CheckpointIO: each update is recorded here as a
``checkpoint_saved`` with ``same_as`` (the target), so the record follows the link. After a
signal save ckptdash ends training, and ModelCheckpoint (``save_last``) would write
``last.ckpt`` at the same step once more, after the attempt ended, as a new periodic save:
ckptdash makes that ``last.ckpt`` itself before the attempt ends — a link to the signal
save (``"link"``) or a copy of its bytes (``True``) — records it as such, and names it in the
signal save's ModelCheckpoint state, so that the resumed ModelCheckpoint goes on with it. A
resume through either loads the checkpoint it stands for (:mod:`ckptdash.resume`).
"""

from __future__ import annotations

import os
import shutil
from typing import IO, Any

from ckptdash.events import CheckpointSaved, Trigger
from ckptdash.lightning import compat
from ckptdash.lightning.compat import ModelCheckpoint
from ckptdash.rundir import atomic_write
from ckptdash.train.engine.session import Session


def follow_links(trainer: Any, session: Session) -> None:
    """Record every update of each ModelCheckpoint's ``save_last="link"`` link."""
    for cb in getattr(trainer, "checkpoint_callbacks", []):
        if isinstance(cb, ModelCheckpoint):
            compat.wrap_link_checkpoint(cb, lambda original: _recording(session, original))


def _recording(session: Session, original: Any) -> Any:
    """ModelCheckpoint's link function, recording each link it makes (rank 0)."""

    def link(trainer: Any, filepath: str, linkpath: str) -> None:
        original(trainer, filepath, linkpath)
        if session.rank == 0 and os.path.abspath(filepath) != os.path.abspath(linkpath):
            step = trainer.global_step
            record_same(session, linkpath, filepath, trigger="periodic", step=step)

    return link


def record_same(
    session: Session,
    path: str,
    target: str,
    *,
    trigger: Trigger,
    step: int | None,
    size_bytes: int | None = None,
    checksum: str = "",
    epoch: int | None = None,
) -> CheckpointSaved | None:
    """Record ``path`` as a link to (or copy of) ``target``, a recorded checkpoint (rank 0)."""
    if session.rank != 0:
        return None
    where, real = os.path.abspath(path), os.path.abspath(target)
    if size_bytes is None:
        try:
            size_bytes = os.stat(where).st_size  # the target's, through the link
        except OSError:
            return None  # Lightning could neither link nor copy: nothing to record
    event = session.writer.emit(
        CheckpointSaved,
        step=step,
        path=where,
        trigger=trigger,
        size_bytes=size_bytes,
        duration_s=0.0,
        checksum=checksum,
        epoch=epoch,
        same_as=real,
    )
    assert isinstance(event, CheckpointSaved)
    return event


def claim_lasts(trainer: Any) -> list[tuple[Any, str]]:
    """Before ckptdash's save that ends training: each ModelCheckpoint whose ``last.ckpt``
    Lightning would write after it (``save_last``, nothing saved by it this attempt), with
    that path. Its ``last_model_path`` is set now, so that the save's callback state names
    the file: an attempt resuming from the save keeps the name (Lightning would otherwise
    take ``last.ckpt`` for a stranger's and write ``last-v1.ckpt``)."""
    out = []
    for cb in getattr(trainer, "checkpoint_callbacks", []):
        if not isinstance(cb, ModelCheckpoint) or not cb.save_last or compat.last_saved(cb):
            continue
        try:
            name = cb.format_checkpoint_name(
                compat.monitor_candidates(cb, trainer), cb.CHECKPOINT_NAME_LAST
            )
        except Exception:  # a filename template that needs a metric not logged: Lightning's
            continue
        cb.last_model_path = os.path.abspath(name)
        out.append((cb, cb.last_model_path))
    return out


def make_lasts(
    trainer: Any, session: Session, lasts: list[tuple[Any, str]], saved: str, trigger: Trigger
) -> None:
    """After that save, at ``saved``, before the attempt ends: make each claimed
    ``last.ckpt`` a link to, or copy of, ``saved`` (rank 0), record it so, and leave
    Lightning's ``on_train_end`` nothing to write."""
    for cb, last in lasts:
        if session.rank == 0 and last != os.path.abspath(saved):
            _make_last(session, cb, last, saved, trigger, trainer)
        compat.mark_last_saved(cb, saved, trainer.global_step)


def _make_last(
    session: Session, cb: Any, last: str, saved: str, trigger: Trigger, trainer: Any
) -> None:
    os.makedirs(os.path.dirname(last), exist_ok=True)
    step, epoch = trainer.global_step, trainer.current_epoch
    if cb.save_last == "link":
        if os.path.lexists(last):
            os.remove(last)
        try:
            os.symlink(os.path.relpath(saved, os.path.dirname(last)), last)
            record_same(session, last, saved, trigger=trigger, step=step, epoch=epoch)
            return
        except OSError:
            pass  # no links here (as Lightning does): a copy
    with open(saved, "rb") as src:

        def copy(f: IO[bytes]) -> None:
            shutil.copyfileobj(src, f, 1 << 20)

        written = atomic_write(last, copy)
    record_same(
        session,
        last,
        saved,
        trigger=trigger,
        step=step,
        size_bytes=written.size_bytes,
        checksum=written.checksum,
        epoch=epoch,
    )
