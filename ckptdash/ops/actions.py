"""What a person can do to a run, once: the actions the CLI, the dashboard and the notebook's
widget all call, so that each does the same thing whoever asks.

=========================  =====================================================================
action                     effect
=========================  =====================================================================
:func:`save_now`           a ``save_now`` command in the run's inbox (the job saves at a step)
:func:`stop_after_save`    a ``stop_after_save`` command (the job saves, then ends unrequeued)
:func:`set_requeue`        the ``requeue_suspended`` setting; then :func:`mirror_requeue` copies
                           it onto the scheduler's job (``Requeue=0/1``, ``-r n/y``)
:func:`pin`                the ``resume_pin`` setting (used once unless ``sticky``), and a crash
                           loop's requeue suspension lifted
:func:`clear_pin`          no pin and no fresh-start request: back to the resume rule
:func:`start_fresh`        the ``fresh_start`` request, and a crash loop's suspension lifted
:func:`hold`,              a requeued job waiting in the scheduler's queue: held, released or
:func:`release`,           cancelled, each only on a job ckptdash may act on (yours, started by
:func:`cancel_pending`     this run: ``Queue.verify_job``)
=========================  =====================================================================

Invariant: a caller checks its *input* against what it shows (the CLI against the run's state,
the dashboard against its snapshot: a pin must name a checkpoint the run recorded) and words
the outcome for its reader; the *effect* — which files change, which settings go with which,
which scheduler command runs after which check — is decided here and nowhere else.

Why: the CLI's ``resume --pin`` used to lift a crash loop's requeue suspension and its
``--clear`` to withdraw a fresh-start request, while the dashboard's pin and clear did neither,
so a pin from the browser after a crash loop left the job suspended. Two copies of one action
drift; one cannot.

Every scheduler call of the login-node side goes through the functions at the bottom of this
module (the one place that calls a scheduler's ``Queue`` for an action).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from ckptdash import control, schedulers
from ckptdash.control import PathArg
from ckptdash.control.settings import CRASH_LOOP_AUTHOR
from ckptdash.errors import ControlError, SchedulerError, SchedulerUnavailable
from ckptdash.events import Command, Settings
from ckptdash.schedulers.base import JobView, Queue, Runner

__all__ = [
    "LIFTED",
    "Changed",
    "cancel_pending",
    "clear_pin",
    "hold",
    "job_for",
    "mirror_requeue",
    "pin",
    "release",
    "save_now",
    "set_requeue",
    "start_fresh",
    "stop_after_save",
]

LIFTED: Final = "requeue: back to auto (it was suspended after a crash loop)"
"""The line every caller shows when an action lifted a crash loop's requeue suspension."""


@dataclass(frozen=True)
class Changed:
    """The run's settings after an action, and whether it lifted a crash loop's suspension."""

    settings: Settings
    lifted_crash_loop: bool = False


# --- commands to the running job -------------------------------------------------------------


def save_now(
    run: PathArg, *, author: str | None = None, ttl_s: float = control.DEFAULT_TTL_S
) -> Command:
    """Ask the job to save at its next step boundary (trigger ``manual``); the command sent."""
    return control.issue(run, "save_now", author=author, ttl_s=ttl_s)


def stop_after_save(
    run: PathArg, *, author: str | None = None, ttl_s: float = control.DEFAULT_TTL_S
) -> Command:
    """Ask the job to save, then end without requeue; the command sent (callers confirm)."""
    return control.issue(run, "stop_after_save", author=author, ttl_s=ttl_s)


# --- settings --------------------------------------------------------------------------------


def set_requeue(run: PathArg, *, suspended: bool, author: str | None = None) -> Settings:
    """Suspend (True) or resume (False) automatic requeue after preemption; the new settings.

    Resuming also ends a crash loop's suspension (it is the same setting). The scheduler's own
    flag is :func:`mirror_requeue`'s, called after this: the run's setting holds even when the
    scheduler refuses.
    """
    return control.update_settings(run, requeue_suspended=_strict_bool(suspended), author=author)


def pin(run: PathArg, path: str, *, sticky: bool = False, author: str | None = None) -> Changed:
    """Make the next attempt resume from ``path`` (used once, or by every attempt if
    ``sticky``), and lift a crash loop's requeue suspension: pinning is the user's answer to
    the loop, and a suspended job would never start to use the pin.

    ``path`` must be a checkpoint the run recorded; the caller checked it against what it
    shows (:func:`ckptdash.resume.find_recorded`, a snapshot's ``valid_paths``).
    """
    lifted = _crash_loop_suspended(run)
    settings = control.update_settings(
        run,
        resume_pin=path,
        sticky=_strict_bool(sticky),
        requeue_suspended=False if lifted else None,
        author=author,
    )
    return Changed(settings, lifted)


def clear_pin(run: PathArg, *, author: str | None = None) -> Changed:
    """Back to the resume rule: no pin, and no fresh-start request waiting either."""
    settings = control.update_settings(run, resume_pin=None, fresh_start=False, author=author)
    return Changed(settings)


def start_fresh(run: PathArg, *, author: str | None = None) -> Changed:
    """The next attempt starts fresh, and no checkpoint from before it is chosen again
    (docs/resume-rule.md); a crash loop's requeue suspension is lifted, as for :func:`pin`."""
    lifted = _crash_loop_suspended(run)
    settings = control.update_settings(
        run, fresh_start=True, requeue_suspended=False if lifted else None, author=author
    )
    return Changed(settings, lifted)


def _crash_loop_suspended(run: PathArg) -> bool:
    """Requeue is suspended, and by a crash loop (a suspension someone set by hand stays)."""
    current = control.read_settings(run)
    return current.requeue_suspended and current.updated_by == CRASH_LOOP_AUTHOR


def _strict_bool(value: object) -> bool:
    # A hand-made websocket message can send anything; truthiness must not decide a policy.
    if not isinstance(value, bool):
        raise ControlError(f"{value!r}: must be True or False")
    return value


# --- the scheduler's side (any scheduler's queue, from the login node) ------------------------

JobRoot = str | os.PathLike[str] | None
"""The run directory whose log named the job (it must have started it), or None for a job
the user named (``--job``): then only "yours" is checked."""


def job_for(
    attempts: Iterable[schedulers.Attempt],
    given: str | None = None,
    *,
    runner: Runner | None = None,
) -> tuple[Queue, str] | None:
    """The scheduler's queue and the job to act on: ``given`` (the user named it; checked to
    look like a job id of the scheduler the run recorded, else of the one whose commands are
    here), else the job of the newest attempt that recorded one; None when there is none."""
    found = schedulers.job_of(attempts)
    if given:
        name = found[0] if found else schedulers.queue_here()
        queue = schedulers.queue_for(name, runner)
        if queue is None:
            raise ControlError(f"{name}: no queue commands known for this scheduler")
        return queue, queue.check_job_id(given)
    if found is None:
        return None
    queue = schedulers.queue_for(found[0], runner)
    return None if queue is None else (queue, found[1])


def mirror_requeue(queue: Queue, job: str, *, allowed: bool, run_root: JobRoot) -> str:
    """Copy the run's new requeue setting onto its job's own switch (SLURM's ``Requeue=1/0``,
    Grid Engine's ``-r y/n``); one line saying what happened.

    The job is verified first (``run_root=None``: the user named it, so only "yours" is
    checked). Where the scheduler cannot be asked the line says the switch is not set (the
    run's own setting still holds for the job's signal handler); a refusal raises
    :class:`SchedulerError` saying that the run's setting changed and the job's switch did not.
    """
    try:
        queue.verify_job(job, run_root=run_root)
    except SchedulerUnavailable as exc:
        return f"{queue.name} job {job}: {queue.switch(allowed)} not set: {exc}"
    except SchedulerError as exc:  # nothing is sent to the scheduler unverified
        raise type(exc)(
            f"{exc}; the run's setting is changed, the job's {queue.switch_name} flag is not"
        ) from None
    return queue.mirror_requeue(job, allowed)


def hold(queue: Queue, job: str, *, run_root: JobRoot) -> JobView:
    """Keep the verified, pending job from starting (``scontrol hold``, ``qhold``)."""
    queue.verify_job(job, run_root=run_root)
    return queue.hold(job)


def release(queue: Queue, job: str, *, run_root: JobRoot) -> JobView:
    """Let the verified, held job start again (``scontrol release``, ``qrls``)."""
    queue.verify_job(job, run_root=run_root)
    return queue.release(job)


def cancel_pending(queue: Queue, job: str, *, run_root: JobRoot) -> JobView | None:
    """Cancel the verified job only while it waits in the queue (``scancel --state=PENDING``,
    ``qdel`` of a pending job); the scheduler's view after, or None once it forgot the job."""
    queue.verify_job(job, run_root=run_root)
    return queue.cancel_pending(job)
