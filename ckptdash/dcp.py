"""``torch.distributed.checkpoint`` through ckptdash: atomic, manifested, recorded.

    with ckptdash.Monitor("runs/exp1") as monitor:
        path = monitor.load()                       # a directory Path, or None
        if path is not None:
            dcp.load(state, checkpoint_id=path)     # state: your (sharded) state dict
        ...
        ckptdash.dcp.save(monitor, state)           # every rank; rank 0 publishes

Each save writes into a temp directory next to the target, is renamed into place
once every rank's shards and DCP's ``.metadata`` are written, and gets a manifest
of every file, so a resume never picks a directory with a missing or changed shard
(DCP itself only checks that ``.metadata`` exists).
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import Future
from typing import Any

from ckptdash.errors import SaveError
from ckptdash.events import CheckpointSaved, Trigger
from ckptdash.train.checkpoints import publish
from ckptdash.train.monitor import Monitor

__all__ = ["async_save", "save"]


def save(
    monitor: Monitor,
    state_dict: dict[str, Any],
    path: str | os.PathLike[str] | None = None,
    *,
    trigger: Trigger | None = None,
    **dcp_options: Any,
) -> None:
    """``dcp.save(state_dict)`` into ``path`` (default ``checkpoints/step=N``) on every rank,
    through :meth:`Monitor.saving`. A pending signal / Save now / Stop is answered by it."""
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    with monitor.saving(path, trigger=trigger) as tmp:
        dcp_save(state_dict, checkpoint_id=tmp, **dcp_options)


def async_save(
    monitor: Monitor,
    state_dict: dict[str, Any],
    path: str | os.PathLike[str] | None = None,
    *,
    trigger: Trigger = "periodic",
    **dcp_options: Any,
) -> Future[CheckpointSaved | None]:
    """``dcp.async_save`` (call on every rank); published and recorded when it completes.

    The returned future completes after rank 0 renamed the directory into place and
    recorded ``checkpoint_saved`` (DCP's future on the coordinator completes only after
    every rank's shards and ``.metadata`` are written); on other ranks when DCP's does.
    It raises if the save failed (``checkpoint_failed`` is recorded). A save that a
    signal or command asked for should use :func:`save`: it must be on disk before the
    job requeues or stops.
    """
    from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save

    session = monitor.session
    target = path if path else monitor.config.checkpoint_path / f"step={session.step}"
    monitor.declare_checkpoint_dir(os.path.dirname(os.path.abspath(target)))
    pending = publish.begin(session, target, trigger)
    done: Future[CheckpointSaved | None] = Future()
    try:
        response = dcp_async_save(state_dict, checkpoint_id=pending.temp, **dcp_options)
    except BaseException as exc:
        with contextlib.suppress(SaveError):  # recorded as failed; the caller sees exc
            publish.finish_lead(session, pending, exc)
        raise
    # With a staging option DCP answers with two futures; the save is done at the upload's.
    inner: Future[Any] = getattr(response, "upload_completion", None) or response  # type: ignore[assignment]

    def finished(fut: Any) -> None:
        try:
            error = fut.exception()
            done.set_result(publish.finish_lead(session, pending, error))
        except BaseException as exc:  # handed to whoever waits on the future
            done.set_exception(exc)

    inner.add_done_callback(finished)
    return done
