"""The resume choice of an attempt, judged on rank 0 and agreed by every rank.

The rule itself is :mod:`ckptdash.resume`; here rank 0 applies it (or judges the
checkpoint the user gave), records what it refused as ``checkpoint_invalid``, and
every rank gets the same answer.
"""

from __future__ import annotations

from collections.abc import Collection

from ckptdash.errors import CheckpointChoiceError
from ckptdash.events import CheckpointInvalid
from ckptdash.resume import ResumeChoice, ValidateMode, choose_resume, judge_given
from ckptdash.rundir import RunDir
from ckptdash.rundir.writer import EventWriter
from ckptdash.train.engine import dist


def choose(
    run: RunDir,
    lead: EventWriter | None,
    *,
    validate: ValidateMode,
    exclude: Collection[str] = (),
) -> ResumeChoice:
    """The resume rule's choice (collective). ``lead`` is rank 0's writer, None elsewhere;
    ``exclude``: paths that are no candidates this time."""
    choice = None
    if lead is not None:
        choice = choose_resume(run, validate=validate, exclude=exclude)
        for path, reason in choice.skipped:
            lead.emit(CheckpointInvalid, path=path, reason=reason)
    choice = dist.broadcast_object(choice)
    assert choice is not None
    return choice


def check_given(
    run: RunDir, lead: EventWriter | None, path: str, *, validate: ValidateMode
) -> tuple[str, str]:
    """The file to load for the user's ``path`` (itself, or the checkpoint a link points at)
    and the ``run_resumed`` reason (collective), or
    :class:`~ckptdash.errors.CheckpointChoiceError` on every rank after ``lead`` (rank 0's
    writer, None elsewhere) recorded why as ``checkpoint_invalid`` (an artifact stays as it
    is: a good file, only not one to resume from)."""
    verdict = None
    if lead is not None:
        verdict = judge_given(run, path, validate=validate)
        if verdict.error is not None and not verdict.artifact:
            reason = f"given to resume from, refused: {verdict.problem}"
            lead.emit(CheckpointInvalid, path=verdict.path, reason=reason)
    verdict = dist.broadcast_object(verdict)
    assert verdict is not None
    if verdict.error is not None:
        raise CheckpointChoiceError(verdict.error)
    return verdict.load or verdict.path, verdict.reason
