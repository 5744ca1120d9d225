"""Recording every checkpoint Lightning writes: the CheckpointIO wrappers and the sharded
strategies' own saves, each stamped with ckptdash's metadata and recorded with its trigger."""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable
from typing import Any, Final, Protocol

from ckptdash.events import CheckpointRemoved, CheckpointSaved, Trigger
from ckptdash.lightning import compat
from ckptdash.lightning.compat import CheckpointIO, TorchCheckpointIO
from ckptdash.train.checkpoints import written
from ckptdash.train.checkpoints.async_save import AsyncSaver
from ckptdash.train.checkpoints.saving import (
    META_KEY,
    Written,
    durable_existing,
    record_save,
    save_atomic,
)
from ckptdash.train.engine.session import Session

# The file name _MultiProcessingLauncher gives the weights a ddp_spawn worker hands back.
_SPAWN_HANDOVER_NAME: Final = ".temp.ckpt"


class SaveSource(Protocol):
    """What the wrappers need of the callback that installed them."""

    _forced_trigger: Trigger | None
    """The trigger of the save ckptdash itself decided and is making now, else None."""

    def trigger_now(self) -> Trigger: ...

    def on_checkpoint_saved(self, event: CheckpointSaved) -> None: ...


class RecordingCheckpointIO(CheckpointIO):
    """Wraps a CheckpointIO: records every save/remove; saves atomically where it can.

    For Lightning's default ``TorchCheckpointIO`` ckptdash writes the same
    ``torch.save`` file itself, atomically and with the checksum computed while
    writing. Any other IO writes as it always did; ckptdash then fsyncs the
    result and reads it once for the checksum.
    """

    def __init__(
        self,
        inner: Any,
        session: Session,
        callback: SaveSource,
        saver: AsyncSaver | None = None,
    ) -> None:
        super().__init__()
        self.inner = inner
        self.session = session
        self.callback = callback
        self.saver = saver
        """ckptdash's own background saves (``async_save=True``): stage here, persist later."""
        self.saves_seen = 0
        """How many saves reached this IO: a strategy's own save that did not is recorded apart."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        self.saves_seen += 1
        if is_spawn_handover(path):
            # ddp_spawn hands the final weights to its launcher through a temp file that the
            # launcher deletes at once: not a checkpoint anyone can resume from.
            self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)
            return
        declare_dir_of(self.session, path)
        if type(self.inner) is not TorchCheckpointIO or storage_options is not None:
            record_written(
                self.session,
                self.callback,
                checkpoint,
                path,
                lambda: self.inner.save_checkpoint(
                    checkpoint, path, storage_options=storage_options
                ),
                plugin=self.inner,
            )
            return
        meta = stamp(self.session, self.callback, checkpoint)
        trigger: Trigger = meta["trigger"]
        if self.saver is not None and self.callback._forced_trigger is not None:
            # A save ckptdash decided is waited for before it answers or requeues: written
            # directly (after the saves in flight), it is durable sooner than staged first.
            # An earlier background failure must not stop it (a preemption is coming).
            self.saver.wait()
        elif self.saver is not None:
            self.saver.submit(  # like AsyncCheckpointIO, an earlier failed save ends fit()
                self.session.writer,
                checkpoint,
                os.fspath(path),
                trigger=trigger,
                step=meta.get("step"),
                epoch=checkpoint.get("epoch"),
                on_saved=self.callback.on_checkpoint_saved,
                fail_on_earlier=True,
                monitored=monitored_scores(checkpoint),
                artifact=weights_only(checkpoint),
            )
            return
        saved = save_atomic(
            self.session.writer,
            checkpoint,
            os.path.abspath(os.fspath(path)),
            trigger=trigger,
            step=meta.get("step"),
            epoch=checkpoint.get("epoch"),
            monitored=monitored_scores(checkpoint),
            artifact=weights_only(checkpoint),
        )
        if saved is not None:
            self.callback.on_checkpoint_saved(saved)

    def load_checkpoint(self, path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        out: dict[str, Any] = self.inner.load_checkpoint(path, *args, **kwargs)
        return out

    def remove_checkpoint(self, path: Any) -> None:
        if self.saver is not None:
            self.saver.wait()  # never remove a file a background save is still writing
        self.inner.remove_checkpoint(path)
        self.session.writer.emit(
            CheckpointRemoved, path=os.path.abspath(os.fspath(path)), reason="removed by Lightning"
        )

    def teardown(self) -> None:
        self.inner.teardown()


def record_written(
    session: Session,
    callback: SaveSource,
    checkpoint: dict[str, Any],
    path: Any,
    write_files: Callable[[], object],
    *,
    lead: bool = True,
    plugin: Any = None,
) -> None:
    """Record a save that other code writes (a custom CheckpointIO, a sharded strategy): stamp
    ckptdash's metadata into ``checkpoint``, run ``write_files``, then on the ``lead`` rank fsync
    what it wrote (a file, or a directory of shards) and record it as saved.

    A ``plugin`` (a user's CheckpointIO) may write somewhere other than ``path``: what it really
    wrote is looked for (:mod:`ckptdash.train.checkpoints.written`) and recorded as
    ``written_at``; if
    nothing can be found the save is recorded as unvalidated, with a warning, and training
    goes on: ckptdash never fails a save that worked for a path it cannot see.
    """
    meta = stamp(session, callback, checkpoint)
    target = os.path.abspath(os.fspath(path))
    declare_dir_of(session, target)
    folder = os.path.dirname(target)
    own = (session.run.events, session.run.inbox.parent)  # ckptdash's files change meanwhile

    def write() -> tuple[int, str] | Written:
        before = written.listing(folder, own) if lead and plugin is not None else {}
        write_files()
        if not lead:
            return 0, ""
        if plugin is None:
            return durable_existing(target)
        return really_written(
            plugin,
            target,
            before,
            lambda: written.listing(folder, own),
            saying=f"{type(plugin).__name__} saved {target}",
            stacklevel=2,
        )

    saved = record_save(
        session.writer if lead else None,
        target,
        trigger=meta["trigger"],
        step=meta.get("step"),
        epoch=checkpoint.get("epoch"),
        write=write,
        monitored=monitored_scores(checkpoint),
        artifact=weights_only(checkpoint),
    )
    if saved is not None:
        callback.on_checkpoint_saved(saved)


WEIGHTS_ONLY: Final = "weights only (save_weights_only=True): no optimizer or callback state"
"""The ``artifact`` of a Lightning checkpoint saved with ``weights_only``."""


def weights_only(checkpoint: dict[str, Any]) -> str | None:
    """Why a Lightning checkpoint cannot resume training, or None when it can.

    ``trainer.save_checkpoint(path, weights_only=True)`` (what ``ModelCheckpoint(
    save_weights_only=True)`` calls) leaves out ``optimizer_states``, which Lightning's
    ``fit(ckpt_path=...)`` then refuses to restore; a full checkpoint always has the key
    (an empty list without optimizers).
    """
    if "state_dict" in checkpoint and "optimizer_states" not in checkpoint:
        return WEIGHTS_ONLY
    return None


def monitored_scores(checkpoint: dict[str, Any]) -> dict[str, float] | None:
    """What each ``ModelCheckpoint`` with a ``monitor`` measured for this save.

    Lightning sets a ModelCheckpoint's ``current_score`` just before it saves, and the
    checkpoint carries every callback's state, so the value is read where the save is
    recorded; a missing or non-finite score is left out.
    """
    out: dict[str, float] = {}
    states = checkpoint.get("callbacks")
    if not isinstance(states, dict):
        return None
    for state in states.values():
        if not isinstance(state, dict):
            continue
        monitor, score = state.get("monitor"), state.get("current_score")
        if not isinstance(monitor, str) or not monitor or score is None:
            continue
        try:
            value = float(score)
        except (TypeError, ValueError):  # a tensor of several values: not a score
            continue
        if math.isfinite(value):
            out[monitor] = value
    return out or None


def really_written(
    saver: Any,
    target: str,
    before: written.Listing,
    after: Callable[[], written.Listing],
    *,
    saying: str,
    stacklevel: int,
) -> Written:
    """What ``saver`` (a user's CheckpointIO, or a strategy that bypasses it) really wrote for
    ``target``: the path it reports, else the one :func:`written.locate` finds between the
    ``before`` listing and ``after()``; its size and checksum once durable. Nothing found, or
    files ckptdash cannot read: recorded as unvalidated, with a warning (``saying`` opens it,
    ``stacklevel`` as seen from the caller) — the save worked, ckptdash only cannot see it."""
    real = written.reported_by(saver, target)
    if real is None:
        found = written.locate(target, before, after())
        if found.path is None:
            warnings.warn(
                f"ckptdash: {saying} where ckptdash cannot see it ({found.why_not}); recorded"
                " as unvalidated",
                RuntimeWarning,
                stacklevel=stacklevel + 1,
            )
            return Written(0, "", unvalidated=found.why_not)
        real = found.path
    try:
        size, checksum = durable_existing(real)
    except OSError as exc:  # the saver's files, unreadable to ckptdash: its save worked
        why = f"cannot read {real}: {exc.strerror or exc}"
        warnings.warn(f"ckptdash: {why}; recorded as unvalidated", RuntimeWarning, stacklevel + 1)
        return Written(0, "", unvalidated=why)
    return Written(size, checksum, written_at=None if real == target else real)


def declare_dir_of(session: Session, path: Any) -> None:
    """Declare the folder a checkpoint is saved in, so its record counts as this run's."""
    session.declare_checkpoint_dir(os.path.dirname(os.path.abspath(os.fspath(path))))


def is_spawn_handover(path: Any) -> bool:
    """Whether ``path`` is the ``<tmp>/.temp.ckpt`` a ddp_spawn worker writes for its launcher."""
    return bool(os.path.basename(os.fspath(path)) == _SPAWN_HANDOVER_NAME)


def stamp(session: Session, callback: SaveSource, checkpoint: dict[str, Any]) -> Any:
    """ckptdash's metadata in ``checkpoint`` (kept if a wrapper stamped it first), at the step
    the checkpoint itself holds: between checks the session's own step may lag behind."""
    step = checkpoint.get("global_step")
    if isinstance(step, int):
        session.step = step
    return checkpoint.setdefault(META_KEY, session.metadata(callback.trigger_now()))


def flush_async(io: Any) -> None:
    """Wait for the saves an AsyncCheckpointIO queued (re-raise a failed one), or ckptdash's
    own background saves (their failures are events; the next save raises them)."""
    if isinstance(io, RecordingCheckpointIO) and io.saver is not None:
        io.saver.wait()
    if not isinstance(io, TaggingCheckpointIO):
        return
    compat.flush_async_io(io.inner)


class TaggingCheckpointIO(RecordingCheckpointIO):
    """Outside an AsyncCheckpointIO: stamps the trigger on the caller's thread, then queues."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        self.saves_seen += 1
        stamp(self.session, self.callback, checkpoint)
        declare_dir_of(self.session, path)  # here, not in the worker thread
        self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)

    def remove_checkpoint(self, path: Any) -> None:
        self.inner.remove_checkpoint(path)  # the inner recorder reports it
