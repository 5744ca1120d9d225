"""ckptdash's resume rule inside Lightning's fit(): judging the ``ckpt_path`` it resolved."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

from ckptdash.errors import CheckpointMismatchError, CkptDashError
from ckptdash.lightning.frames import UNKNOWN, given_ckpt_path
from ckptdash.train.misfit import MISFIT_ERRORS, misfit_message
from ckptdash.train.session import Session

_HPC_NAME: Final = re.compile(r"^hpc_ckpt_\d+\.ckpt$")


def hook_resume(trainer: Any, session: Session) -> None:
    """Make the trainer's checkpoint connector resume from ckptdash's choice (or the user's
    validated ``ckpt_path``) and record the resume."""
    # Lightning picks the path inside fit() before any hook runs, then hands it to
    # resume_start(); this is the one place a callback can apply its own rule.
    connector = trainer._checkpoint_connector
    original = connector.resume_start

    def resume_start(checkpoint_path: Any = None, *args: Any, **kwargs: Any) -> Any:
        path = checkpoint_path
        given = given_ckpt_path(trainer)
        hpc = path is not None and _HPC_NAME.match(Path(os.fspath(path)).name) is not None
        if given is None or (given is UNKNOWN and (path is None or hpc)):
            # No choice of the user's: ckptdash's rule, over Lightning's own picks (an
            # old hpc_ckpt_N on SLURM, "last" when OnExceptionCheckpoint is there).
            choice = session.choose_resume()
            lightning_pick = f" (instead of Lightning's {Path(path).name})" if path else ""
            path, reason = choice.path, choice.reason + lightning_pick
        elif path is not None:
            # The user's explicit choice is respected, once it validates.
            reason = session.check_given(os.fspath(path))
        # else: the user asked (e.g. "last") and Lightning found nothing: load nothing.
        with _misfit_as_one_line(session, path):
            result = original(path, *args, **kwargs)
        if path is not None:
            loaded = getattr(connector, "_loaded_checkpoint", None) or {}
            step = loaded.get("global_step")
            step = step if isinstance(step, int) else None
            session.record_resumed(os.fspath(path), reason, step=step)
        return result

    connector.resume_start = resume_start
    # The checkpoint is read in resume_start, but loaded into the model and the optimizers
    # afterwards: a shape mismatch fails there.
    for name in ("restore_model", "restore_training_state"):
        setattr(connector, name, _fitting(session, connector, getattr(connector, name)))


def _fitting(session: Session, connector: Any, method: Callable[[], Any]) -> Callable[[], Any]:
    def restore() -> Any:
        with _misfit_as_one_line(session, getattr(connector, "_ckpt_path", None)):
            return method()

    return restore


@contextlib.contextmanager
def _misfit_as_one_line(session: Session, path: Any) -> Iterator[None]:
    """A checkpoint that does not fit the model fails the attempt with one line naming it
    and the fix (:mod:`ckptdash.train.misfit`), instead of Lightning's long error."""
    try:
        yield
    except MISFIT_ERRORS as exc:
        if path is None or isinstance(exc, CkptDashError):
            raise
        message = misfit_message(session.run.root, os.fspath(path), exc)
        raise CheckpointMismatchError(message) from exc
