"""The resume rule: which checkpoint the next attempt loads, and why.

1. The user's pin (``ckptdash resume RUN_DIR --pin PATH``), if it names a
   checkpoint this run recorded and it validates.
2. Else the newest valid checkpoint by step (then by time) across every
   trigger and attempt — a newer periodic save beats an older signal save.
3. Else a fresh start.

A candidate is valid when its file still exists, its size matches the
``checkpoint_saved`` event, and (in ``checksum`` mode) its checksum matches.
A directory checkpoint is valid when its manifest matches the recorded digest
and every file it lists is there, unchanged (see :mod:`ckptdash.manifest`).
Every candidate that fails is reported with the reason. Validation reads
bytes; it never unpickles anything.
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from ckptdash import control, manifest
from ckptdash.errors import CkptDashError
from ckptdash.hashing import checksum_file
from ckptdash.records import CheckpointInfo
from ckptdash.rundir import RUN_FILE, RunDir
from ckptdash.safe_read import open_regular
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
    state = RunState(str(run.root), run.info().run_id, confine=True)
    for batch in RunTailer(run).batches():
        state.apply(batch)
    return state


def check_checkpoint(info: CheckpointInfo, validate: ValidateMode = "checksum") -> str | None:
    """Why ``info`` cannot be resumed from, or None if it can (reads bytes, never unpickles)."""
    path = Path(info.path)
    try:
        if path.is_dir():
            return _check_directory(path, info, validate)
        # One open, then fstat: a FIFO or a device (a link to /dev/zero) is refused, never
        # read; and at most the recorded size is hashed, however long the file has grown.
        fd, st = open_regular(path, follow_symlinks=True)
        os.close(fd)
    except FileNotFoundError:
        return "file is missing"
    except OSError as exc:
        return f"cannot read it: {exc.strerror}"
    if st.st_size != info.size_bytes:
        return f"size {st.st_size} bytes != recorded {info.size_bytes} (truncated or replaced)"
    if validate == "checksum" and info.checksum:
        try:
            size, checksum = checksum_file(path, limit=info.size_bytes)
        except OSError as exc:
            return f"cannot read it: {exc.strerror}"
        if size != info.size_bytes:
            return f"size {size} bytes != recorded {info.size_bytes} (changed while read)"
        if checksum != info.checksum:
            return "checksum does not match the recorded one (corrupted or overwritten)"
    return None


def _check_directory(path: Path, info: CheckpointInfo, validate: ValidateMode) -> str | None:
    """A directory checkpoint: every file against the manifest inside it (see
    :mod:`ckptdash.manifest`). A record from before manifests (empty checksum) and a
    directory without one are checked by total size, as they were then."""
    if info.checksum or (path / manifest.MANIFEST_NAME).exists():
        return manifest.verify(
            path,
            expected_digest=info.checksum,
            size_bytes=info.size_bytes,
            checksums=validate == "checksum",
        )
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return None if size == info.size_bytes else f"size {size} != recorded {info.size_bytes}"


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
        info, copied = _in_this_copy(run, info, validate)
        problem = _opened_outside(state, info) or check_checkpoint(info, validate)
        if problem is None:
            reason = f"newest valid checkpoint (step {info.step}, trigger {info.trigger})"
            if skipped:
                reason += f"; skipped {len(skipped)} invalid candidate(s)"
            return ResumeChoice(info.path, reason + copied, info.step, skipped)
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


def _in_this_copy(
    run: RunDir, info: CheckpointInfo, validate: ValidateMode
) -> tuple[CheckpointInfo, str]:
    """A run directory copied with its log (``cp -r run copy``) keeps the run id and the
    original's absolute checkpoint paths. For a path inside another run directory with the
    same run id, use the copy's own file at the same place when it matches the record; either
    way the second value says so (empty when ``run`` is not such a copy)."""
    path = Path(info.path)
    root = run.root.resolve()
    if not path.is_absolute() or path.is_relative_to(root):
        return info, ""
    origin = next((p for p in path.parents if (p / RUN_FILE).is_file()), None)
    if origin is None or origin.resolve() == root:
        return info, ""
    try:
        same = RunDir(origin).info().run_id == run.info().run_id
    except (CkptDashError, OSError):
        same = False
    if not same:
        return info, ""  # another run's checkpoint, recorded on purpose
    note = f"; {run.root} is a copy of {origin} (same run id {run.info().run_id})"
    own = replace(info, path=str(root / path.relative_to(origin)))
    if check_checkpoint(own, validate) is None:
        return own, note + ": resuming from the copy's own file"
    return info, note + f": its own {own.path} is missing or differs, so the original's file"


@dataclass(frozen=True)
class GivenVerdict:
    """A checkpoint the user chose (``fit(ckpt_path=...)``) judged against the run's record.

    ``error`` is set when it must not be loaded (the message for the user, naming the file,
    why, and the newest valid alternative); else ``reason`` is for ``run_resumed``.
    """

    path: str
    error: str | None
    reason: str
    problem: str | None = None


def judge_given(
    run_dir: str | os.PathLike[str] | RunDir,
    path: str | os.PathLike[str],
    *,
    validate: ValidateMode = "checksum",
) -> GivenVerdict:
    """Validate a checkpoint the user chose and compare it with the newest valid one.

    A file this run recorded is checked like a resume candidate (size, checksum); another
    file only for being complete (a ``torch.save`` zip archive with its directory at the end).
    """
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    target = os.path.abspath(os.fspath(path))
    state = load_state(run)
    newest = choose_resume(run, validate=validate, state=state)
    info = state.checkpoints.get(target) or find_recorded(state, target)
    if info is None:
        problem = _incomplete_file(Path(target))
    elif info.status != "saved":
        problem = f"the run's log says it is {info.status}" + (
            f" ({info.reason})" if info.reason else ""
        )
    else:
        problem = check_checkpoint(info, validate)
    better = newest.path if newest.path and os.path.abspath(newest.path) != target else None
    if problem is not None:
        instead = (
            f" The newest valid checkpoint is {better} (step {newest.step}): pass it as"
            " ckpt_path, or pass no ckpt_path to let ckptdash choose."
            if better
            else " No valid checkpoint is recorded: pass ckpt_path=None to start fresh."
        )
        error = f"{target}: cannot resume from it: {problem}.{instead}"
        return GivenVerdict(target, error, "", problem)
    reason = "given to fit(ckpt_path=...)"
    if info is None:
        reason += " (not recorded by this run: checked only that the file is complete)"
    given_step = info.step if info is not None else None
    if better and (given_step is None or (newest.step or 0) > given_step):
        reason += f"; a newer valid checkpoint exists: {better} (step {newest.step})"
    return GivenVerdict(target, None, reason)


def _incomplete_file(path: Path) -> str | None:
    """Why a checkpoint file nobody recorded is certainly unusable, or None."""
    if path.is_dir():
        return None  # a sharded checkpoint: its format is the strategy's
    try:
        fd, _st = open_regular(path, follow_symlinks=True)  # never blocks on a FIFO
    except FileNotFoundError:
        return "file is missing"
    except OSError as exc:
        return f"cannot read it: {exc.strerror}"
    with os.fdopen(fd, "rb") as f:
        head = f.read(4)
        # torch.save writes a zip archive whose directory is at the end: a file that starts
        # like one but has no directory was cut short. Other formats (legacy pickles) are
        # left alone.
        if head.startswith(b"PK") and not zipfile.is_zipfile(f):
            return "truncated: the zip archive torch.save writes has no directory at its end"
    return None
