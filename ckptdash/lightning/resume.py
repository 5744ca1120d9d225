"""ckptdash's resume rule inside Lightning's fit(): judging the ``ckpt_path`` it resolved.

A checkpoint the rule chose that turns out not to resume this training — one that holds
weights only (recorded before records said so), or one that does not fit the model — is
refused as ``checkpoint_invalid`` and the next one the rule chooses is loaded instead, in
the same attempt: a newer misfit never turns the run into a crash loop while an older
checkpoint fits. When none fits (the model changed), the newest one's error ends the
attempt as before, and none of them is refused.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from ckptdash.errors import CheckpointChoiceError, CheckpointMismatchError, CkptDashError
from ckptdash.events import CheckpointInvalid
from ckptdash.lightning import compat
from ckptdash.lightning.checkpoint_io import weights_only
from ckptdash.lightning.compat import UNKNOWN, given_ckpt_path
from ckptdash.train.checkpoints.misfit import MISFIT_ERRORS, gist, misfit_message, older_resumable
from ckptdash.train.engine.session import Session

_HPC_NAME: Final = re.compile(r"^hpc_ckpt_\d+\.ckpt$")

_MAX_FALLBACKS: Final = 3
"""How many older checkpoints a misfit falls back to before the attempt fails (each is a
full load: a changed model fits none of them, and must not read the whole folder)."""


def hook_resume(trainer: Any, session: Session) -> None:
    """Make the trainer's checkpoint connector resume from ckptdash's choice (or the user's
    validated ``ckpt_path``) and record the resume."""
    _ResumeHook(trainer, session).install()


class _ResumeHook:
    """The connector's ``resume_start`` / ``restore_model`` / ``restore_training_state``,
    wrapped: the choice, the fall-back, and ``run_resumed`` once the model is loaded."""

    def __init__(self, trainer: Any, session: Session) -> None:
        self.trainer = trainer
        self.session = session
        self.connector = compat.checkpoint_connector(trainer)
        self._resume_start = self.connector.resume_start
        self._restore_model = self.connector.restore_model
        self._restore_training = self.connector.restore_training_state
        self._by_rule = False
        self._pending: tuple[str, str] | None = None  # (path, reason) to record once loaded
        self._misfits: list[tuple[str, str]] = []  # (path, why) read but not fitting the model
        self._first: CheckpointMismatchError | None = None  # the first of them's error

    def install(self) -> None:
        # Lightning picks the path inside fit() before any hook runs, then hands it to
        # resume_start(); this is the one place a callback can apply its own rule.
        self.connector.resume_start = self.resume_start
        # The checkpoint is read in resume_start, but loaded into the model and the optimizers
        # afterwards: a shape mismatch fails there.
        self.connector.restore_model = self.restore_model
        self.connector.restore_training_state = self.restore_training_state

    def resume_start(self, checkpoint_path: Any = None, *args: Any, **kwargs: Any) -> Any:
        path = checkpoint_path
        given = given_ckpt_path(self.trainer)
        hpc = path is not None and _HPC_NAME.match(Path(os.fspath(path)).name) is not None
        self._by_rule = (
            given is None or given == "hpc" or (given is UNKNOWN and (path is None or hpc))
        )
        self._misfits, self._first = [], None
        if self._by_rule:
            # No choice of the user's: ckptdash's rule, over Lightning's own picks (an
            # old hpc_ckpt_N on SLURM, "last" when OnExceptionCheckpoint is there).
            choice = self.session.choose_resume()
            lightning_pick = f" (instead of Lightning's {Path(path).name})" if path else ""
            if given == "hpc":
                lightning_pick = ' (fit(ckpt_path="hpc"): ckptdash\'s resume rule)'
            path, reason = choice.path, choice.reason + lightning_pick
        elif path is not None:
            # The user's explicit choice is respected, once it validates (a link: its target).
            path, reason = self.session.check_given(os.fspath(path))
        # else: the user asked (e.g. "last") and Lightning found nothing: load nothing.
        while True:
            try:
                with _misfit_as_one_line(self.session, path):
                    result = self._resume_start(path, *args, **kwargs)
            except CheckpointMismatchError as exc:  # not a Lightning checkpoint
                path, reason = self._next_fitting(path, exc)
                continue
            why = self._cannot_resume() if path is not None else None
            if why is None:
                break
            if not self._by_rule:
                raise CheckpointChoiceError(
                    f"{os.fspath(path)}: cannot resume training from it: {why}; pass a"
                    " checkpoint that holds the optimizer state, or no ckpt_path to let"
                    " ckptdash choose"
                )
            # An artifact its record does not mark (saved before records said so): refused
            # for good, and the rule's next choice read instead.
            _refuse(self.session, path, f"cannot resume training from it: {why}")
            choice = self.session.choose_resume(exclude=self._tried())
            refused, path = os.path.basename(path), choice.path
            reason = f"{choice.reason}; fell back from {refused} ({why})"
        self._pending = None if path is None else (os.fspath(path), reason)
        return result

    def _tried(self) -> list[str]:
        return [p for p, _ in self._misfits]

    def _cannot_resume(self) -> str | None:
        """Why the checkpoint just read cannot resume training (fitting only), or None."""
        if getattr(self.trainer.state, "fn", None) != "fit":
            return None
        loaded = compat.loaded_checkpoint(self.connector)
        return weights_only(loaded) if loaded else None

    def _next_fitting(self, path: Any, exc: CheckpointMismatchError) -> tuple[str, str]:
        """After ``path`` did not fit the model: the rule's next choice (path, reason), to be
        read instead; re-raises when the user chose ``path`` or nothing else is left.

        Nothing is refused until one fits: a changed model fits none, and must still fail
        (and alert) with every checkpoint left as it was.
        """
        if not self._by_rule or path is None or len(self._misfits) >= _MAX_FALLBACKS:
            raise exc
        self._misfits.append((os.fspath(path), gist(exc.__cause__ or exc)))
        self._first = self._first or exc
        choice = self.session.choose_resume(exclude=self._tried())
        if choice.path is None:
            raise self._fits_none(self._first) from self._first.__cause__
        return choice.path, choice.reason

    def _fits_none(self, first: CheckpointMismatchError) -> CheckpointMismatchError:
        """The error when no checkpoint fits the model (it changed): start fresh."""
        if len(self._misfits) == 1:
            return first
        cause = first.__cause__ if first.__cause__ is not None else first
        others = ", ".join(os.path.basename(p) for p, _ in self._misfits[1:])
        message = misfit_message(self.session.run.root, self._misfits[0][0], cause)
        return CheckpointMismatchError(f"{message}; nor do the older {others}")

    def restore_model(self) -> Any:
        while True:
            path = compat.connector_ckpt_path(self.connector)
            try:
                with _misfit_as_one_line(self.session, path):
                    result = self._restore_model()
                break
            except CheckpointMismatchError as exc:
                candidate, reason = self._next_fitting(path, exc)
                self._resume_start(candidate)
                self._pending = (candidate, reason)
        if self._misfits:
            for refused, why in self._misfits:
                _refuse(self.session, refused, f"does not fit this model: {why}")
            if self._pending is not None:
                shown = ", ".join(f"{os.path.basename(p)} ({why})" for p, why in self._misfits)
                path, reason = self._pending
                self._pending = (path, f"{reason}; fell back from {shown}: does not fit")
            self._misfits = []
        if self._pending is not None:
            path, reason = self._pending
            self._pending = None
            loaded = compat.loaded_checkpoint(self.connector)
            step = loaded.get("global_step")
            self.session.record_resumed(path, reason, step=step if isinstance(step, int) else None)
        return result

    def restore_training_state(self) -> Any:
        path = compat.connector_ckpt_path(self.connector)
        with _misfit_as_one_line(self.session, path):
            return self._restore_training()


def _refuse(session: Session, path: str, reason: str) -> None:
    """Record (rank 0) that ``path``, a recorded checkpoint, failed to load for ``reason``
    (``checkpoint_invalid``): no later choice takes it again."""
    if session.rank == 0:
        where = os.path.abspath(path)
        session.writer.emit(CheckpointInvalid, step=session.step, path=where, reason=reason)


@contextlib.contextmanager
def _misfit_as_one_line(session: Session, path: Any) -> Iterator[None]:
    """A checkpoint that does not fit the model fails the attempt with one line naming it
    and the fix (:mod:`ckptdash.train.checkpoints.misfit`), instead of Lightning's long error."""
    try:
        yield
    except MISFIT_ERRORS as exc:
        if path is None or isinstance(exc, CkptDashError):
            raise
        where = os.fspath(path)
        older = older_resumable(session.run.root, where)
        message = misfit_message(session.run.root, where, exc, older=older)
        raise CheckpointMismatchError(message) from exc
