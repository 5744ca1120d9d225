"""Stop requeueing a job that fails the same way at every start (a crash loop).

When the newest attempts all failed the same way before saving anything (health's
``crash_loop``: a checkpoint that does not fit the model, a broken configuration), the next
attempt would fail again: the attempt that makes it a loop records ``requeue_skipped``
saying so and suspends requeue in the run's settings (``updated_by``
:data:`~ckptdash.control.settings.CRASH_LOOP_AUTHOR`), so no signal requeues the job until
someone looks. A pin or a fresh start lifts that suspension, from the CLI, the dashboard or the
notebook alike (:mod:`ckptdash.ops.actions`); ``ckptdash requeue RUN --resume`` too.
"""

from __future__ import annotations

from ckptdash import control
from ckptdash.analysis import health
from ckptdash.control.settings import CRASH_LOOP_AUTHOR
from ckptdash.events import RequeueSkipped
from ckptdash.rundir import RunDir
from ckptdash.rundir.writer import EventWriter
from ckptdash.state.reading import load_state


def respond(run: RunDir, writer: EventWriter, step: int) -> str | None:
    """After this attempt's ``run_failed`` (rank 0): if the run is now in a crash loop,
    record ``requeue_skipped`` and suspend requeue; returns the reason, or None."""
    try:
        alert = health.crash_loop(load_state(run))
        if alert is None:
            return None
        reason = f"crash loop: {alert.detail}; requeue suspended in {run.settings}"
        writer.emit(RequeueSkipped, step=step, reason=reason)
        control.update_settings(run, requeue_suspended=True, author=CRASH_LOOP_AUTHOR)
    except Exception:  # never turn a failed attempt into another failure
        return None
    return reason
