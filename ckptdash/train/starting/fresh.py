"""A fresh start that lasts: the fresh-start boundary an attempt records in ``run_started``.

A changed model cannot load the old model's checkpoints, and the resume rule would hand
them to every attempt (the newest valid one by step wins). So a fresh start is recorded in
the log, not only acted on once: an attempt that starts fresh writes why in
``run_started.fresh``, and the resume rule never chooses a checkpoint an earlier attempt
recorded again (docs/resume-rule.md). Two ways to ask:

* ``ckptdash resume RUN --fresh`` sets ``fresh_start`` in the run's settings; the next
  attempt records the boundary and clears the setting (a request is taken once);
* ``fresh="model-v2"`` given to the Monitor or callback: the first attempt with that value
  records the boundary, its requeues (same value, already recorded) resume normally.
"""

from __future__ import annotations

import contextlib

from ckptdash import control
from ckptdash.errors import CkptDashError
from ckptdash.rundir import RunDir
from ckptdash.state import RunState
from ckptdash.train.config import TrainConfig


def fresh_start(run: RunDir, config: TrainConfig, state: RunState) -> tuple[str, bool]:
    """Why the attempt starting now starts fresh ("" when it does not), and whether that
    answers a request in the settings (to be cleared once ``run_started`` is durable)."""
    try:
        settings = control.read_settings(run)
    except CkptDashError:
        settings = None  # the resume rule reports the unreadable file
    if settings is not None and settings.fresh_start:
        who = f" by {settings.updated_by}" if settings.updated_by else ""
        return f"ckptdash resume --fresh{who}", True
    label = config.fresh_label
    if label and not any(a.fresh == label for a in state.attempts.values()):
        return label, False
    return "", False


def consume_fresh_request(run: RunDir) -> None:
    """Clear the settings' fresh-start request: the boundary in the log now holds it."""
    with contextlib.suppress(Exception):  # never fail a start over it; the boundary holds
        control.update_settings(run, fresh_start=False)
