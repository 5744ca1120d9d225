"""Hugging Face Accelerate through ckptdash: ``save_state`` recorded, ``load_state`` chosen.

    accelerator = Accelerator(project_config=ProjectConfiguration(
        project_dir="out", automatic_checkpoint_naming=True, total_limit=3))
    with ckptdash.Monitor("runs/exp1") as monitor:
        ckptdash.accelerate.load_state(monitor, accelerator)   # newest valid checkpoint_N
        for step in ...:
            monitor.step(step, loss=loss.item())
            if step % 500 == 0 or monitor.should_save:
                ckptdash.accelerate.save_state(monitor, accelerator)
            if monitor.should_stop:
                break

With automatic naming Accelerate writes ``checkpoint_N`` in place and deletes the
oldest beyond ``total_limit``: each save is recorded with a manifest of its files
and each deletion as removed. With an explicit ``output_dir`` the save goes through
:meth:`~ckptdash.Monitor.saving` (a temp directory renamed into place).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ckptdash.events import CheckpointSaved, Trigger
from ckptdash.train.monitor import Monitor

__all__ = ["load_state", "save_model", "save_state"]

_AUTO_NAME = re.compile(r"^checkpoint_(\d+)$")


def save_state(
    monitor: Monitor,
    accelerator: Any,
    output_dir: str | os.PathLike[str] | None = None,
    *,
    trigger: Trigger | None = None,
    **options: Any,
) -> CheckpointSaved | None:
    """``accelerator.save_state()`` on every rank, recorded (a pending decision answered)."""
    folder = _auto_folder(accelerator)
    if folder is None:
        if output_dir is None:
            raise ValueError(
                "save_state: pass output_dir, or build the Accelerator with"
                " ProjectConfiguration(automatic_checkpoint_naming=True)"
            )
        with monitor.saving(output_dir, trigger=trigger) as tmp:
            accelerator.save_state(str(tmp), **options)
        return None
    monitor.declare_checkpoint_dir(folder)
    before = _numbered(folder)
    out = accelerator.save_state(**options)
    saved = monitor.record(out, trigger=trigger)
    limit = accelerator.project_configuration.total_limit
    for gone in sorted(set(before) - set(_numbered(folder))):
        monitor.record_removed(gone, reason=f"rotated by Accelerate (total_limit={limit})")
    return saved


def save_model(
    monitor: Monitor,
    accelerator: Any,
    model: Any,
    save_directory: str | os.PathLike[str],
    **options: Any,
) -> CheckpointSaved | None:
    """``accelerator.save_model(model, save_directory)`` on every rank, recorded as an
    artifact (the model's weights alone: never resumed from; ``save_state`` is for that)."""
    accelerator.save_model(model, os.fspath(save_directory), **options)
    accelerator.wait_for_everyone()
    why = "Accelerate save_model: the model's weights alone (save_state resumes training)"
    return monitor.record(save_directory, trigger="api", resumable=why)


def load_state(monitor: Monitor, accelerator: Any, **options: Any) -> Path | None:
    """Load the resume rule's choice with ``accelerator.load_state``; None on a fresh start.

    With automatic naming the next ``checkpoint_N`` number continues after the highest
    folder present (Accelerate restarts at 0 and would refuse an existing one, e.g. a
    damaged newer save that ckptdash skipped).
    """
    path = monitor.load()
    if path is None:
        return None
    if not isinstance(path, Path):
        raise ValueError(
            f"the resume rule chose {monitor.resume_choice.path}, a file, not an"
            " accelerator.save_state() directory"
        )
    accelerator.load_state(str(path), **options)
    folder = _auto_folder(accelerator)
    if folder is not None:
        numbers = list(_numbered(folder).values())
        accelerator.project_configuration.iteration = max(numbers, default=-1) + 1
    return path


def _auto_folder(accelerator: Any) -> Path | None:
    config = accelerator.project_configuration
    if not config.automatic_checkpoint_naming:
        return None
    return Path(os.path.abspath(accelerator.project_dir)) / "checkpoints"


def _numbered(folder: Path) -> dict[Path, int]:
    try:
        return {p: int(m[1]) for p in folder.iterdir() if (m := _AUTO_NAME.match(p.name))}
    except OSError:
        return {}
