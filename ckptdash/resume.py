"""The resume rule: which checkpoint the next attempt loads, and why.

1. The user's pin (``ckptdash resume RUN_DIR --pin PATH``), if it names a
   checkpoint this run recorded and it validates.
2. Else the newest valid checkpoint by step (then by time) across every
   trigger and attempt — a newer periodic save beats an older signal save.
3. Else a fresh start.

Only checkpoints that resume training (model, optimizer and loop state) are candidates or
pins: an artifact (``checkpoint_saved`` with ``artifact``: weights only, an export, a model
alone) is passed over, and the reason says so when a newer one was. A link or a copy of a
recorded checkpoint (``same_as``: Lightning's ``last.ckpt``) stands for that checkpoint:
its target is the candidate, and a link whose target leaves the run's checkpoint folders
is refused.

A fresh start asked for (``ckptdash resume RUN --fresh``, not yet taken by an attempt) wins
over both. Once an attempt started fresh (``run_started`` with ``fresh``: the fresh-start
boundary), checkpoints recorded by earlier attempts are history, never candidates again
(a pin may still name one on purpose).

A candidate is valid when its file still exists, its size matches the
``checkpoint_saved`` event, and (in ``checksum`` mode) its checksum matches.
A directory checkpoint is valid when its manifest matches the recorded digest
and every file it lists is there, unchanged (see :mod:`ckptdash.rundir.manifest`).
A directory checkpoint must also be safe to load (:mod:`ckptdash.rundir.load_safety`): a DCP
``.metadata`` must unpickle with DCP's own classes only and its non-tensor values with
``weights_only=True``; any other directory must be written by the job's user alone.
Every candidate that fails is reported with the reason. Validation never unpickles
anything but DCP's metadata and values, under those restrictions.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from ckptdash import control
from ckptdash.errors import CkptDashError
from ckptdash.rundir import RUN_FILE, RunDir, load_safety, manifest
from ckptdash.rundir.hashing import checksum_file
from ckptdash.rundir.safe_read import open_regular
from ckptdash.state import RunState
from ckptdash.state.reading import load_state
from ckptdash.state.records import CheckpointInfo

ValidateMode = Literal["checksum", "size"]


@dataclass(frozen=True)
class ResumeChoice:
    """The checkpoint to load (``None``: fresh start), why, and what was skipped on the way."""

    path: str | None
    reason: str
    step: int | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)
    passed_over: list[tuple[str, str]] = field(default_factory=list)
    """Newer artifacts (path, why it cannot resume training) the rule did not choose: valid
    files, but not candidates (never recorded as ``checkpoint_invalid``)."""


def check_checkpoint(info: CheckpointInfo, validate: ValidateMode = "checksum") -> str | None:
    """Why ``info`` cannot be resumed from, or None if it can (reads bytes, never unpickles).

    The files checked are where they were really written (``written_at``, when a plugin
    redirected them). A record ckptdash could not check when it was saved (``unvalidated``)
    cannot be checked now either: it is trusted, and the loader's own checks decide.
    """
    if info.unvalidated:
        return None
    path = Path(info.written_at or info.path)
    linked = info.same_as is not None and os.path.islink(path)
    if linked and os.path.realpath(path) != os.path.realpath(info.same_as or ""):
        return f"the link now points at {os.path.realpath(path)}, not {info.same_as}"
    try:
        if path.is_dir():
            return _check_directory(path, info, validate) or _load_refusal(path, info, validate)
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
    :mod:`ckptdash.rundir.manifest`). A record from before manifests (empty checksum) and a
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


def _load_refusal(path: Path, info: CheckpointInfo, validate: ValidateMode) -> str | None:
    """Why loading the directory could run code (see :mod:`ckptdash.rundir.load_safety`), or
    None."""
    verified = validate == "checksum" and bool(info.checksum)
    if os.path.lexists(path / load_safety.DCP_METADATA):
        # Files DCP does not write (Lightning's meta.pt) are loaded by the framework's code.
        problem = load_safety.dcp_refusal(path)
        if problem is None and not load_safety.only_dcp_files(path):
            problem = load_safety.directory_refusal(path, checksums_verified=verified)
        return problem
    return load_safety.directory_refusal(path, checksums_verified=verified)


def choose_resume(
    run_dir: str | os.PathLike[str] | RunDir,
    *,
    validate: ValidateMode = "checksum",
    state: RunState | None = None,
    exclude: Collection[str] = (),
) -> ResumeChoice:
    """Apply the resume rule to a run directory. See the module docstring for the rule.

    ``exclude``: recorded paths that are no candidates this time (ones this attempt already
    failed to load into the model)."""
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    state = state if state is not None else load_state(run)
    skipped: list[tuple[str, str]] = []
    try:
        settings = control.read_settings(run)
        pin, fresh_asked = settings.resume_pin, settings.fresh_start
    except CkptDashError as exc:
        pin, fresh_asked = None, False
        skipped.append((str(run.settings), f"settings unreadable, pin ignored: {exc}"))
    if fresh_asked:
        who = f" by {settings.updated_by}" if settings.updated_by else ""
        return ResumeChoice(
            None, f"fresh start requested{who} (ckptdash resume --fresh)", None, skipped
        )
    passed: list[tuple[str, str]] = []
    if pin:
        recorded = find_recorded(state, pin)
        if recorded is not None:
            recorded = _target_of(state, recorded)
        if recorded is None:
            skipped.append((pin, "pinned path is not a checkpoint this run recorded; refused"))
        elif recorded.artifact:
            passed.append((recorded.path, f"pinned, refused: {recorded.artifact}"))
        elif why := _opened_outside(state, recorded):
            skipped.append((recorded.path, f"pinned checkpoint is invalid: {why}"))
        elif (problem := check_checkpoint(recorded, validate)) is not None:
            skipped.append((recorded.path, f"pinned checkpoint is invalid: {problem}"))
        else:
            return ResumeChoice(recorded.path, "pinned in the run settings", recorded.step, skipped)
    boundary = state.fresh_start()
    since = boundary.attempt if boundary is not None else -1
    for info in reversed(state.valid_checkpoints()):
        if info.attempt is not None and info.attempt < since:
            continue  # from before the fresh start: history, not a candidate
        if info.artifact:
            passed.append((info.path, info.artifact))
            continue
        if info.path in exclude:
            continue
        if _target_recorded(state, info):
            continue  # a link or copy: the checkpoint it stands for is the candidate
        info, copied = _in_this_copy(run, info, validate)
        problem = _opened_outside(state, info) or link_outside(state, info)
        problem = problem or check_checkpoint(info, validate)
        if problem is None:
            reason = f"newest valid checkpoint (step {info.step}, trigger {info.trigger})"
            if info.unvalidated:
                reason = (
                    f"newest checkpoint (step {info.step}, trigger {info.trigger}),"
                    " unvalidated: its CheckpointIO wrote where ckptdash cannot check it"
                )
            if skipped:
                reason += f"; skipped {len(skipped)} invalid candidate(s)"
            reason += _passed_over_note(passed)
            return ResumeChoice(info.path, reason + copied, info.step, skipped, passed)
        skipped.append((info.path, problem))
    reason = "no valid checkpoint recorded: fresh start"
    if boundary is not None:
        reason = (
            f"no valid checkpoint since the fresh start of attempt {boundary.attempt}"
            f" ({boundary.fresh}): fresh start"
        )
    if passed:
        reason = reason.replace("no valid checkpoint", "no valid checkpoint that resumes training")
    return ResumeChoice(None, reason + _passed_over_note(passed), None, skipped, passed)


def artifact_problem(info: CheckpointInfo) -> str:
    """Why ``info``, an artifact, is no checkpoint to resume from (one clause)."""
    return (
        f"it is an artifact ({info.artifact}), it cannot resume training (no optimizer or"
        " loop state); load its weights yourself for a warm start"
    )


def artifact_refusal(info: CheckpointInfo) -> str:
    """The refusal of a pin of ``info``, an artifact: the file, why, and what to pin."""
    return (
        f"{info.path}: {artifact_problem(info)}; pin a checkpoint that resumes training"
        " (`ckptdash status` marks artifacts)"
    )


def _passed_over_note(passed: list[tuple[str, str]]) -> str:
    if not passed:
        return ""
    path, why = passed[0]
    more = f" and {len(passed) - 1} more" if len(passed) > 1 else ""
    return f"; passed over {os.path.basename(path)} ({why}){more}: artifact, cannot resume training"


def _target_recorded(state: RunState, info: CheckpointInfo) -> bool:
    """Whether ``info`` links to or copies a checkpoint the run holds as saved."""
    if info.same_as is None:
        return False
    target = state.checkpoints.get(info.same_as)
    return target is not None and target.status == "saved"


def _target_of(state: RunState, info: CheckpointInfo) -> CheckpointInfo:
    """The checkpoint ``info`` stands for: itself, or the saved one it links to or copies."""
    if info.same_as is not None and _target_recorded(state, info):
        return state.checkpoints[info.same_as]
    return info


def link_outside(state: RunState, info: CheckpointInfo) -> str:
    """Why following ``info``'s path, a symbolic link, leaves the run's checkpoint folders
    ("" when it is no link, or stays inside): such a link is refused (docs/security.md)."""
    path = info.written_at or info.path
    if not os.path.islink(path):
        return ""
    real = os.path.realpath(path)
    if state.outside(real):
        return (
            f"a symbolic link to {real}, outside the run directory and every checkpoint folder"
            " this run declared; refused"
        )
    return ""


def _opened_outside(state: RunState, info: CheckpointInfo) -> str:
    """Why the file a loader would open for ``info`` (a relative path: from this process's
    working directory) is not where the run keeps checkpoints ("" when it is)."""
    return state.outside(os.path.abspath(info.path)) if not os.path.isabs(info.path) else ""


def resume_path(run_dir: str | os.PathLike[str]) -> str | None:
    """The checkpoint the next attempt should load, or ``None`` for a fresh start.

    >>> ckptdash.resume_path("runs/exp1")   # trainer.fit(model, ckpt_path=...) takes it
    'runs/exp1/checkpoints/epoch=3-step=12448.ckpt'
    """
    run = RunDir(run_dir)
    if not run.is_run():
        return None
    return choose_resume(run).path


def find_recorded(state: RunState, pin: str) -> CheckpointInfo | None:
    """The saved checkpoint of this run that ``pin`` names, or None: pins are limited to what
    the run recorded. ``pin`` may be the recorded path, a path from here (absolute or not),
    or a path relative to the run directory, the way ``ckptdash status`` prints it
    (``checkpoints/epoch=5-step=350.ckpt``)."""
    # abspath, not realpath: a link the pin names is not followed to a recorded file (a link
    # planted beside the checkpoints is refused, as docs/security.md says).
    wanted = {os.path.abspath(pin)}
    if state.root and not os.path.isabs(pin):
        wanted.add(os.path.abspath(os.path.join(state.root, pin)))
    for info in state.valid_checkpoints():
        seen = {info.path, os.path.abspath(info.path), os.path.realpath(info.path)}
        if pin in seen or seen & wanted:
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
    why, and the newest valid alternative); else ``reason`` is for ``run_resumed`` and
    ``load`` is the file to load: ``path`` itself, or the checkpoint a link (``last.ckpt``)
    points at.
    """

    path: str
    error: str | None
    reason: str
    problem: str | None = None
    load: str | None = None
    artifact: bool = False
    """The refusal is of an artifact: a good file, only not one to resume from."""


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
    load, through, problem = target, "", None
    if os.path.islink(target):
        # Lightning's last.ckpt under save_last="link": the checkpoint it points at is what
        # loads, so that is what is judged (its own record, when the link's is stale).
        load = os.path.realpath(target)
        through = f" (through the link {os.path.basename(target)})"
        info = state.checkpoints.get(load) or find_recorded(state, load)
        if state.outside(load):
            problem = (
                f"a symbolic link to {load}, outside the run directory and every checkpoint"
                " folder this run declared; refused"
            )
    elif info is not None and _target_recorded(state, info):
        info = _target_of(state, info)
        load, through = info.path, f" (the copy {os.path.basename(target)} stands for it)"
    if problem is None:
        problem = _given_problem(info, load, validate)
    better = newest.path if newest.path and os.path.abspath(newest.path) != load else None
    if problem is not None:
        instead = (
            f" The newest valid checkpoint is {better} (step {newest.step}): pass it as"
            " ckpt_path, or pass no ckpt_path to let ckptdash choose."
            if better
            else " No valid checkpoint is recorded: pass ckpt_path=None to start fresh."
        )
        error = f"{target}: cannot resume from it: {problem}.{instead}"
        artifact = info is not None and bool(info.artifact)
        return GivenVerdict(target, error, "", problem, artifact=artifact)
    reason = "given to fit(ckpt_path=...)" + through
    if info is None:
        reason += " (not recorded by this run: checked only that the file is complete)"
    given_step = info.step if info is not None else None
    if better and (given_step is None or (newest.step or 0) > given_step):
        reason += f"; a newer valid checkpoint exists: {better} (step {newest.step})"
    return GivenVerdict(target, None, reason, load=load)


def _given_problem(info: CheckpointInfo | None, load: str, validate: ValidateMode) -> str | None:
    """Why the given checkpoint (its record ``info``, if any; the file ``load``) cannot be
    resumed from, or None."""
    if info is None:
        return _incomplete_file(Path(load))
    if info.artifact:
        return artifact_problem(info)
    if info.status != "saved":
        return f"the run's log says it is {info.status}" + (
            f" ({info.reason})" if info.reason else ""
        )
    return check_checkpoint(info, validate)


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
