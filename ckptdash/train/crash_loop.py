"""Stop requeueing a job that fails the same way at every start (a crash loop).

When the newest attempts all failed the same way before saving anything (health's
``crash_loop``: a checkpoint that does not fit the model, a broken configuration), the next
attempt would fail again: the attempt that makes it a loop records ``requeue_skipped``
saying so and suspends requeue in the run's settings (``updated_by`` :data:`AUTHOR`), so no
signal requeues the job until someone looks. ``ckptdash resume RUN --fresh`` or ``--pin``
lifts that suspension; ``ckptdash requeue RUN --resume`` too.
"""

from __future__ import annotations

import contextlib
from typing import Final

from ckptdash import control
from ckptdash.analysis import health
from ckptdash.events import RequeueSkipped
from ckptdash.rundir import RunDir
from ckptdash.rundir.writer import EventWriter
from ckptdash.state.reading import load_state

AUTHOR: Final = "ckptdash crash loop"
"""``updated_by`` of the requeue suspension a crash loop wrote."""


def respond(run: RunDir, writer: EventWriter, step: int) -> str | None:
    """After this attempt's ``run_failed`` (rank 0): if the run is now in a crash loop,
    record ``requeue_skipped`` and suspend requeue; returns the reason, or None."""
    try:
        alert = health.crash_loop(load_state(run))
        if alert is None:
            return None
        reason = f"crash loop: {alert.detail}; requeue suspended in {run.settings}"
        writer.emit(RequeueSkipped, step=step, reason=reason)
        control.update_settings(run, requeue_suspended=True, author=AUTHOR)
    except Exception:  # never turn a failed attempt into another failure
        return None
    return reason


def lift(run: RunDir) -> bool:
    """Undo a crash loop's requeue suspension (the user acted: a fresh start, a pin); True
    when there was one. A suspension someone set by hand stays."""
    with contextlib.suppress(Exception):
        settings = control.read_settings(run)
        if settings.requeue_suspended and settings.updated_by == AUTHOR:
            control.update_settings(run, requeue_suspended=False)
            return True
    return False
