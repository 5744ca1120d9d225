"""DeepSpeed engines through ckptdash: each tag saved atomically and recorded, the resume rule's
choice loaded into the engine.

    engine, *_ = deepspeed.initialize(model=model, config=ds_config, ...)
    with ckptdash.Monitor("runs/exp1") as monitor:
        ckptdash.deepspeed.load_checkpoint(monitor, engine)   # None on a fresh start
        for step in ...:
            ...
            monitor.step(step, loss=loss.item())
            if step % 500 == 0 or monitor.should_save:
                ckptdash.deepspeed.save_checkpoint(monitor, engine, keep_last=3)
            if monitor.should_stop:
                break

A save writes DeepSpeed's tag directory (``SAVE_DIR/TAG``: the model states and every rank's
ZeRO optimizer shards) into a temp directory next to it, on every rank; once all of them
returned, rank 0 fsyncs the files, writes a manifest, renames the directory into place and
records it with the time from the call to durable. A kill during the save leaves only the
temp directory, which the next attempt removes and never resumes from.

DeepSpeed's ``latest`` file (``SAVE_DIR/latest``, the tag ``engine.load_checkpoint(SAVE_DIR)``
loads when given no tag) is rewritten after each published save, and, when an attempt starts,
to the tag the resume rule chose, so it always agrees with ckptdash; :func:`load_checkpoint`
itself passes the chosen tag explicitly and never reads ``latest``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Final

from ckptdash.events import Trigger
from ckptdash.rundir import atomic_write
from ckptdash.rundir.manifest import MANIFEST_NAME
from ckptdash.train.engine import dist
from ckptdash.train.monitor import Monitor

__all__ = ["load_checkpoint", "save_checkpoint"]

LATEST: Final = "latest"
"""The file in the save folder naming the tag DeepSpeed loads when it is given none."""


def save_checkpoint(
    monitor: Monitor,
    engine: Any,
    save_dir: str | os.PathLike[str] | None = None,
    tag: str | None = None,
    *,
    client_state: dict[str, Any] | None = None,
    trigger: Trigger | None = None,
    keep_last: int | None = None,
    **options: Any,
) -> Path:
    """``engine.save_checkpoint(save_dir, tag)`` on every rank, published and recorded;
    returns the tag directory.

    ``save_dir`` defaults to the run's ``checkpoints/``, ``tag`` to DeepSpeed's own
    ``global_step<N>``. ``keep_last=N`` then removes the oldest tag directories ckptdash
    published in ``save_dir`` beyond N (never the one the attempt resumed from), each recorded
    as removed. A pending signal / Save now / Stop decision is answered by the save.
    """
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"save_checkpoint: keep_last={keep_last}; use 1 or more, or None")
    folder = Path(os.path.abspath(save_dir if save_dir else monitor.config.checkpoint_path))
    name = str(tag) if tag is not None else f"global_step{engine.global_steps}"
    with monitor.saving(folder / name, trigger=trigger) as tmp:
        # DeepSpeed writes SAVE_DIR/TAG: the temp name is the tag, in the same folder.
        engine.save_checkpoint(
            str(tmp.parent),
            tag=tmp.name,
            client_state=client_state or {},
            save_latest=False,
            **options,
        )
    if monitor.session.rank == 0:
        _point_latest(folder, name)
        if keep_last is not None:
            _rotate(monitor, folder, keep_last, keep={name})
    dist.agree_max([0])  # every rank returns once `latest` and the rotation are done
    return folder / name


def load_checkpoint(monitor: Monitor, engine: Any, **options: Any) -> dict[str, Any] | None:
    """Load the resume rule's choice into ``engine`` (every rank); recorded as this attempt's
    resume. Returns DeepSpeed's client state (a dict), or None on a fresh start.

    The chosen tag is passed to ``engine.load_checkpoint`` explicitly: DeepSpeed's ``latest``
    is not read, and rank 0 rewrites it to name the chosen tag.
    """
    path = monitor.load()
    if path is None:
        return None
    if not isinstance(path, Path):
        raise ValueError(
            f"the resume rule chose {monitor.resume_choice.path}, a file, not a DeepSpeed tag"
            " directory saved by engine.save_checkpoint (pin one with `ckptdash pin`)"
        )
    if monitor.session.rank == 0:
        _point_latest(path.parent, path.name)
    loaded, client_state = engine.load_checkpoint(str(path.parent), tag=path.name, **options)
    if loaded is None:
        raise FileNotFoundError(
            f"DeepSpeed loaded nothing from {path} (its log says why): the files ckptdash"
            " validated are there, so check the engine's ZeRO stage and world size match the"
            " save's"
        )
    return dict(client_state or {})


def _point_latest(folder: Path, tag: str) -> None:
    atomic_write(folder / LATEST, tag.encode())


def _rotate(monitor: Monitor, folder: Path, keep_last: int, keep: set[str]) -> None:
    """Remove the oldest published tag directories of ``folder`` beyond ``keep_last`` (a link
    is never one: ckptdash published real directories, and removing through a link would reach
    outside the folder)."""
    resumed = monitor.resume_choice.path
    tags = sorted(
        (
            p
            for p in folder.iterdir()
            if not p.is_symlink() and p.is_dir() and (p / MANIFEST_NAME).is_file()
        ),
        key=lambda p: (p / MANIFEST_NAME).stat().st_mtime_ns,
    )
    for old in tags[: max(0, len(tags) - keep_last)]:
        if old.name in keep or str(old) == resumed:
            continue
        shutil.rmtree(old)
        monitor.record_removed(old, reason=f"rotated by ckptdash.deepspeed (keep_last={keep_last})")
