"""The requeue policy: whether this attempt may requeue its job now, and doing it.

The policy is read fresh at the moment of the requeue (the run directory's settings
may have changed since the start: a Suspend requeue click just before preemption
counts), and every outcome is an event: ``requeue_issued`` or ``requeue_skipped``
with the reason.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ckptdash import control
from ckptdash.events import RequeueIssued, RequeueSkipped
from ckptdash.rundir import RunDir
from ckptdash.rundir.writer import EventWriter
from ckptdash.schedulers.base import Scheduler
from ckptdash.train.config import TrainConfig
from ckptdash.train.engine.decision import REQUEUE


def requeue(
    writer: EventWriter,
    config: TrainConfig,
    run: RunDir,
    scheduler: Scheduler,
    *,
    attempt: int,
    step: int,
) -> bool:
    """Requeue the job unless the policy refuses; record which (rank 0). Returns True when the
    scheduler said the job is being cancelled (Grid Engine's ``qdel`` sends the same signal as
    a reschedule): saved, not requeued, and the attempt ends as terminated."""
    cancelled = scheduler.cancelled()
    if cancelled:
        writer.emit(RequeueSkipped, step=step, reason=f"{cancelled}: saved, not requeued")
        return True
    reason = refusal(config, run, scheduler, attempt=attempt)
    if reason is not None:
        writer.emit(RequeueSkipped, step=step, reason=reason)
        return False
    result = scheduler.requeue()
    if result.ok:
        writer.emit(RequeueIssued, step=step, job_id=scheduler.job_id, command=result.command)
    else:
        # The output stays in the event: a refusal (a command's, or the scheduler's own
        # before it would exit 99) says why here.
        status = "" if result.returncode is None else f" exit {result.returncode}"
        writer.emit(
            RequeueSkipped,
            step=step,
            reason=f"requeue command failed (`{result.command}`{status}):"
            f" {result.output or 'no output'}",
        )
    return False


def refusal(config: TrainConfig, run: RunDir, scheduler: Scheduler, *, attempt: int) -> str | None:
    """Why the job must not be requeued now, or None. ``attempt`` is the run's attempt
    number, used for the budget only where the scheduler does not count restarts."""
    if config.requeue == "off":
        return "requeue is off in the configuration (TrainConfig.requeue='off')"
    try:
        settings = control.read_settings(run)
    except Exception as exc:  # a broken settings file must not stop the save path
        return f"settings unreadable, not requeueing to be safe: {exc}"
    if settings.requeue_suspended:
        who = f" by {settings.updated_by}" if settings.updated_by else ""
        return f"suspended{who} in {run.settings}"
    budget = config.max_attempts
    # The budget is per job: its own restarts, not the attempts of earlier jobs in the run.
    own = scheduler.attempt
    attempt = own if own is not None else attempt
    if budget is not None and attempt + 1 >= budget:
        return (
            f"requeue budget reached: attempt {attempt + 1} of {budget}"
            " (raise TrainConfig.max_attempts to allow more)"
        )
    if not scheduler.can_requeue:
        return f"no scheduler to requeue with ({scheduler.name})"
    return None


def plan(config: TrainConfig, scheduler: Scheduler) -> str:
    """What a requeue signal will do about requeueing, as the start-up announcement says it."""
    if config.requeue == "off":
        return "off (TrainConfig.requeue='off')"
    if not scheduler.can_requeue:
        return f"impossible (no scheduler: {scheduler.name})"
    budget = config.max_attempts
    limit = f", at most {budget} attempts" if budget is not None else ""
    return f"by ckptdash ({scheduler.name} job {scheduler.job_id}{limit})"


def late_requeue_signal(signal_code: Callable[[], int], window_s: float) -> bool:
    """Wait up to ``window_s`` for a requeue signal after a terminate signal stopped training;
    True if one came (``signal_code()`` takes the signals seen so far and says the strongest).

    Signals add up until the attempt ends, not only until the check that decided. A terminate
    signal followed a moment later by a requeue signal is one preemption: SLURM with
    ``PreemptParameters=send_user_signal``, and submitit's own ``job._interrupt()``, send
    SIGTERM and then the requeue signal, one ``scancel`` apart (6-105 ms measured on the SLURM
    tier). The caller waits with its handlers still installed (after them, the requeue
    signal's default action would kill it), then requeues: the save is made.
    """
    deadline = time.monotonic() + window_s
    pause = threading.Event()  # never set: short pauses between looks
    while True:
        if signal_code() >= REQUEUE:
            return True
        if time.monotonic() >= deadline:
            return False
        pause.wait(0.01)
