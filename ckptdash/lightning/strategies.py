"""Which Lightning strategies write checkpoints themselves, judged by what they are and do
rather than by their class names, and the recording of saves that bypass the CheckpointIO.

Three kinds of strategy:

1. **Shard writers**: ``DeepSpeedStrategy``, ``FSDPStrategy(state_dict_type="sharded")``,
   ``ModelParallelStrategy(save_distributed_checkpoint=True)`` and every subclass of them
   (``isinstance``, so a user's renamed subclass counts) write a directory of shards on every
   rank without the CheckpointIO. Their save is recorded around the strategy's own call,
   announced before it starts, so a kill during it is known to the next attempt.
2. **Lightning's own save** (``Strategy.save_checkpoint``, kept by DDP, single device, ...):
   rank 0 hands the checkpoint to the CheckpointIO, which records it. Nothing more to do.
3. **Any other strategy that replaces** ``save_checkpoint`` (a user's own, XLA, a subclass of
   DDP that overrides it): each save is watched. If it reached the CheckpointIO, the IO
   recorded it. If rank 0 returned without it, what the strategy wrote is looked for
   (:mod:`ckptdash.train.checkpoints.written`) and recorded after the fact, or recorded as
   unvalidated, both with a warning.

Invariant: every save Lightning asks a strategy for ends as one record (saved, failed or
unvalidated), never none. Reason: a strategy recognised by its name lost every save of a
renamed subclass silently, and with it the progress of each requeued attempt. The test of
kind 1 reads two private attributes, so it lives in :mod:`ckptdash.lightning.compat`
(``writes_shards``, imported here as part of this module's answer).
"""

from __future__ import annotations

__all__ = ["record_outside_io", "replaces_save", "writes_shards"]

import os
import time
import warnings
from collections.abc import Callable
from typing import Any

from ckptdash.lightning.checkpoint_io import (
    RecordingCheckpointIO,
    SaveSource,
    declare_dir_of,
    monitored_scores,
    really_written,
    stamp,
    weights_only,
)
from ckptdash.lightning.compat import Strategy, writes_shards
from ckptdash.train.checkpoints import written
from ckptdash.train.checkpoints.saving import Written, record_save
from ckptdash.train.engine.session import Session

# The strategy classes already warned about (one warning per class and process).
_WARNED: set[type] = set()


def replaces_save(strategy: Any) -> bool:
    """Whether ``strategy``'s class replaces Lightning's ``Strategy.save_checkpoint`` (the one
    that hands rank 0's save to the CheckpointIO): such a save may bypass the IO."""
    return getattr(type(strategy), "save_checkpoint", None) is not Strategy.save_checkpoint


def record_outside_io(
    session: Session,
    callback: SaveSource,
    strategy: Any,
    checkpoint: dict[str, Any],
    path: Any,
    save: Callable[[], object],
) -> None:
    """Run a strategy's own ``save``; if on rank 0 it returned without reaching the recording
    CheckpointIO, record what it wrote (the path it was given, what it reports through
    ``ckptdash_written_path(path)``, or the one entry that appeared near it), else record the
    save as unvalidated. Either way a warning says so, once per strategy class."""
    meta = stamp(session, callback, checkpoint)  # kept by the IO's stamp if the save gets there
    lead = session.rank == 0
    io: Any = getattr(strategy, "checkpoint_io", None)
    seen = io.saves_seen if lead and isinstance(io, RecordingCheckpointIO) else None
    target = os.path.abspath(os.fspath(path))
    declare_dir_of(session, target)
    folder = os.path.dirname(target)
    own = (session.run.events, session.run.inbox.parent)  # ckptdash's files change meanwhile
    before = written.listing(folder, own) if seen is not None else {}
    began = time.perf_counter()
    save()
    if seen is None or io.saves_seen != seen:
        return  # another rank, or the CheckpointIO saw (and recorded) the save
    name = type(strategy).__name__

    def what_was_written() -> Written:
        found = really_written(
            strategy,
            target,
            before,
            lambda: written.listing(folder, own),
            saying=f"{name} saved {target} without its CheckpointIO,",
            stacklevel=4,
        )
        if found.unvalidated:
            return found
        real = found.written_at or target
        if type(strategy) not in _WARNED:
            _WARNED.add(type(strategy))
            warnings.warn(
                f"ckptdash: {name} writes its checkpoints without its CheckpointIO; each save"
                f" (first: {real}) is recorded once it returns, so a kill during a save is not"
                " known to the next attempt (its validation still checks the files)",
                RuntimeWarning,
                stacklevel=4,
            )
        return found

    saved = record_save(
        session.writer,
        target,
        trigger=meta["trigger"],
        step=meta.get("step"),
        epoch=checkpoint.get("epoch"),
        write=what_was_written,
        began=began,
        monitored=monitored_scores(checkpoint),
        artifact=weights_only(checkpoint),
    )
    if saved is not None:
        callback.on_checkpoint_saved(saved)
