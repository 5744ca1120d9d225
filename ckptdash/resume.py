"""The resume rule: which checkpoint the next attempt loads, and why.

1. The user's pin (``ckptdash resume RUN_DIR --pin PATH``), if it names a
   checkpoint this run recorded and it validates.
2. Else the newest valid checkpoint by step (then by time) across every
   trigger and attempt — a newer periodic save beats an older signal save.
3. Else a fresh start.

A candidate is valid when its file still exists, its size matches the
``checkpoint_saved`` event, and (in ``checksum`` mode) its checksum matches.
Every candidate that fails is reported with the reason. Validation reads
bytes; it never unpickles anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ckptdash import control
from ckptdash.errors import CkptDashError
from ckptdash.records import CheckpointInfo
from ckptdash.rundir import RunDir, checksum_file
from ckptdash.state import RunState
from ckptdash.tail import RunTailer

ValidateMode = Literal["checksum", "size"]


@dataclass(frozen=True)
class ResumeChoice:
    """The checkpoint to load (``None``: fresh start), why, and what was skipped on the way."""

    path: str | None
    reason: str
    step: int | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)


def load_state(run_dir: str | os.PathLike[str] | RunDir) -> RunState:
    """Replay a run directory's whole event log into a :class:`RunState`."""
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    state = RunState(str(run.root), run.info().run_id)
    for batch in RunTailer(run).batches():
        state.apply(batch)
    return state


def check_checkpoint(info: CheckpointInfo, validate: ValidateMode = "checksum") -> str | None:
    """Why ``info`` cannot be resumed from, or None if it can (reads bytes, never unpickles)."""
    path = Path(info.path)
    try:
        if path.is_dir():
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            return None if size == info.size_bytes else f"size {size} != recorded {info.size_bytes}"
        size = path.stat().st_size
    except FileNotFoundError:
        return "file is missing"
    except OSError as exc:
        return f"cannot read it: {exc.strerror}"
    if size != info.size_bytes:
        return f"size {size} bytes != recorded {info.size_bytes} (truncated or replaced)"
    if validate == "checksum" and info.checksum:
        try:
            _, checksum = checksum_file(path)
        except OSError as exc:
            return f"cannot read it: {exc.strerror}"
        if checksum != info.checksum:
            return "checksum does not match the recorded one (corrupted or overwritten)"
    return None


def choose_resume(
    run_dir: str | os.PathLike[str] | RunDir,
    *,
    validate: ValidateMode = "checksum",
    state: RunState | None = None,
) -> ResumeChoice:
    """Apply the resume rule to a run directory. See the module docstring for the rule."""
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    state = state if state is not None else load_state(run)
    skipped: list[tuple[str, str]] = []
    try:
        pin = control.read_settings(run).resume_pin
    except CkptDashError as exc:
        pin = None
        skipped.append((str(run.settings), f"settings unreadable, pin ignored: {exc}"))
    if pin:
        recorded = find_recorded(state, pin)
        if recorded is None:
            skipped.append((pin, "pinned path is not a checkpoint this run recorded; refused"))
        elif why := _opened_outside(state, recorded):
            skipped.append((recorded.path, f"pinned checkpoint is invalid: {why}"))
        elif (problem := check_checkpoint(recorded, validate)) is not None:
            skipped.append((recorded.path, f"pinned checkpoint is invalid: {problem}"))
        else:
            return ResumeChoice(recorded.path, "pinned in the run settings", recorded.step, skipped)
    for info in reversed(state.valid_checkpoints()):
        problem = _opened_outside(state, info) or check_checkpoint(info, validate)
        if problem is None:
            reason = f"newest valid checkpoint (step {info.step}, trigger {info.trigger})"
            if skipped:
                reason += f"; skipped {len(skipped)} invalid candidate(s)"
            return ResumeChoice(info.path, reason, info.step, skipped)
        skipped.append((info.path, problem))
    reason = "no valid checkpoint recorded: fresh start"
    return ResumeChoice(None, reason, None, skipped)


def _opened_outside(state: RunState, info: CheckpointInfo) -> str:
    """Why the file a loader would open for ``info`` (a relative path: from this process's
    working directory) is not where the run keeps checkpoints ("" when it is)."""
    return state.outside(os.path.abspath(info.path)) if not os.path.isabs(info.path) else ""


def resume_path(run_dir: str | os.PathLike[str]) -> str | None:
    """The checkpoint the next attempt should load, or ``None`` for a fresh start.

    >>> trainer.fit(model, ckpt_path=ckptdash.resume_path("runs/exp1"))  # doctest: +SKIP
    """
    run = RunDir(run_dir)
    if not run.is_run():
        return None
    return choose_resume(run).path


def find_recorded(state: RunState, pin: str) -> CheckpointInfo | None:
    """The saved checkpoint of this run that ``pin`` names (as recorded, or as an absolute
    path), or None: pins are limited to what the run recorded."""
    wanted = os.path.abspath(pin)
    for info in state.valid_checkpoints():
        if info.path == pin or os.path.abspath(info.path) == wanted:
            return info
    return None
