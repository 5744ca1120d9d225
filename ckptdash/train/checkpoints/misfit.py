"""A checkpoint that does not fit the model: one line that names it and the way out.

A run directory reused after the model changed (a layer resized) or by another framework
(a plain-PyTorch ``step=300.ckpt`` fed to Lightning) holds checkpoints the resume rule
still chooses, and each attempt dies in ``load_state_dict`` with a long error that names
neither the file nor what to do. Loading through ckptdash (the Lightning callback, and
``Monitor`` for a failure before the first step after :meth:`~ckptdash.Monitor.load`) turns
it into :class:`~ckptdash.errors.CheckpointMismatchError` with one line, e.g.::

    checkpoints/step=300.ckpt does not fit this model (size mismatch for fc.weight: ...);
    start fresh with `ckptdash resume runs/exp1 --fresh`, or pin another checkpoint ...

When an older valid checkpoint that resumes training exists (:func:`older_resumable`), the
line names it and the pin instead: "start fresh" would throw it away. (The Lightning callback
first falls back to it by itself, see :mod:`ckptdash.lightning.resume`; the line is for a
model that fits none of them.)
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final

from ckptdash.analysis.health import short_error
from ckptdash.resume import check_checkpoint
from ckptdash.state.reading import load_state

# The errors loading a checkpoint into a model raises when it was written for another model
# or framework: torch's load_state_dict (RuntimeError), Lightning's missing keys (KeyError),
# optimizers' param groups (ValueError), a layout another loader expects (TypeError, ...).
MISFIT_ERRORS: Final = (RuntimeError, KeyError, ValueError, TypeError, AttributeError, IndexError)


def misfit_message(
    run_root: str | os.PathLike[str],
    path: str,
    error: BaseException,
    older: str | None = None,
) -> str:
    """The one line for ``error``, raised while loading ``path`` (a checkpoint of the run at
    ``run_root``) into the model; ``older``: an older checkpoint that resumes training."""
    root = Path(run_root)
    shown = _relative(path, root)
    if older is not None:
        other = _relative(older, root)
        return (
            f"{shown} does not fit this model ({gist(error)}); an older checkpoint that"
            f" resumes training is {other}: `ckptdash resume {root} --pin {other}` (if the"
            f" model changed and fits none, `ckptdash resume {root} --fresh`)"
        )
    return (
        f"{shown} does not fit this model ({gist(error)}); start fresh with"
        f" `ckptdash resume {root} --fresh` (or pin another checkpoint: --pin PATH)"
    )


def older_resumable(run_root: str | os.PathLike[str], path: str) -> str | None:
    """The newest valid checkpoint of the run that resumes training, other than ``path``
    (and links to it), or None. Never raises: it only words an error."""
    failing = os.path.realpath(path)
    try:
        state = load_state(run_root)
        for info in reversed(state.valid_checkpoints()):
            if info.artifact or os.path.realpath(info.same_as or info.path) == failing:
                continue
            if os.path.realpath(info.path) == failing:
                continue
            if check_checkpoint(info, "size") is None:
                return info.path
    except Exception:
        return None
    return None


def gist(error: BaseException) -> str:
    """What ``error`` (a failed load into the model) says, on one short line."""
    text = str(error)
    if isinstance(error, KeyError):
        key = error.args[0] if error.args else ""
        hint = ""
        if key in ("pytorch-lightning_version", "state_dict", "optimizer_states", "loops"):
            hint = ": not a Lightning checkpoint (written by another framework or loop?)"
        return short_error(f"KeyError {key!r}{hint}", 160)
    # torch: "Error(s) in loading state_dict for Net:\n\tsize mismatch for fc.weight: ..."
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    detail = next(
        (
            line
            for line in lines
            if line.startswith(("size mismatch", "Missing key", "Unexpected key"))
        ),
        lines[0] if lines else type(error).__name__,
    )
    # "copying a param with shape torch.Size([1, 4]) from checkpoint, the shape in current
    # model is torch.Size([2, 4])." -> "checkpoint [1, 4], model [2, 4]"
    detail = _SHAPES.sub(r"checkpoint \1, model \2", detail).rstrip(".")
    return short_error(detail, 160)


_SHAPES: Final = re.compile(
    r"copying a param with shape torch\.Size\((\[[^\]]*\])\) from checkpoint, the shape in"
    r" current model is torch\.Size\((\[[^\]]*\])\)"
)


def _relative(path: str, root: Path) -> str:
    for base in (root, root.resolve()):
        try:
            return str(Path(os.path.abspath(path)).relative_to(os.path.abspath(base)))
        except ValueError:
            continue
    return path
