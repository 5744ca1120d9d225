"""SLURM's side of a run, from the login node: the scheduler's view of the job, and the
controls only the scheduler can carry out.

Once a job has been requeued it waits in the queue, and no training process exists to read
the run directory's control channel. Where SLURM's client commands work (the login node the
dashboard and the CLI run on), these functions ask SLURM directly:

* :func:`job_view` — state, reason, hold, requeue flag and restart count of one job
  (``scontrol show job -o``); ``None`` once SLURM has forgotten the job;
* :func:`hold` / :func:`release` — keep a pending (requeued) job from starting, or let it go
  (``scontrol hold`` / ``scontrol release``);
* :func:`cancel_pending` — cancel the job only while it waits in the queue
  (``scancel --state=PENDING``), never a running one;
* :func:`set_requeue` — mirror ckptdash's *requeue suspended* onto the job
  (``scontrol update JobId=J Requeue=0``; ``Requeue=1`` undoes it), so that a preemption that
  kills the job without a usable signal does not requeue it either: SLURM then refuses
  ``scontrol requeue`` with "Requested operation is presently disabled";
  :func:`mirror_requeue` is what the CLI and the dashboard call after changing the setting.

:func:`job_of` finds a run's job id among its attempts (the CLI's state, a dashboard snapshot);
:func:`job_status` asks SLURM about it and answers a :class:`JobStatus` (SLURM's view, or why
there is none), which ``ckptdash status`` prints and the dashboard's SLURM panel shows.

Every action on a job (``ckptdash watch --on``, the dashboard's buttons, ``ckptdash requeue``)
first passes :func:`verify_job`: SLURM must say the job runs as the acting user, and a job id
read from a run's log must be vouched for by a ``run_started`` in a file and folder of the
run owned by that user (:mod:`ckptdash.schedulers.evidence`); otherwise :class:`SlurmRefused`
says why.

Job ids are SLURM's: ``12345``, or ``12345_7`` for one array task (as ckptdash records them).
Every failure raises :class:`SlurmError` with one line naming the job and the fix;
:class:`SlurmUnavailable` means SLURM's commands cannot be used from here at all (not
installed, no configuration, controller unreachable) — callers treat that as "no scheduler
view", not as a broken job.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterable
from typing import Any, ClassVar

from ckptdash.errors import SlurmError as SlurmError  # raised to callers as slurm_queue.SlurmError
from ckptdash.errors import SlurmRefused as SlurmRefused
from ckptdash.errors import SlurmUnavailable as SlurmUnavailable
from ckptdash.schedulers import evidence
from ckptdash.schedulers.base import JobStatus, JobView, Queue, Runner, subprocess_runner, tail

TIMEOUT_S = 10.0
"""How long one SLURM command may take before it counts as unavailable."""

SETTLE_S = 60.0
"""How long :func:`hold` and :func:`cancel_pending` wait for a job that is being requeued
(COMPLETING: its processes are ending, at most SLURM's KillWait) to reach the queue."""

_TRANSIENT = frozenset({"COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})

FINISHED_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
        "TIMEOUT",
    }
)
HOLD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin"})

# What scontrol/scancel print when they cannot talk to SLURM at all.
_UNAVAILABLE = (
    "Could not establish a configuration source",
    "Unable to process configuration file",
    "Unable to contact slurm controller",
    "Zero Bytes were transmitted or received",
    "Socket timed out",
    "Munge encode failed",
    "Invalid authentication credential",
)
_UNKNOWN_JOB = "Invalid job id specified"
_JOB_ID = re.compile(r"^\d+(_\d+)?$")
_USER_ID = re.compile(r"^(.*)\((\d+)\)$")  # UserId=alice(1001)
_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


def job_status(job_id: str, *, runner: Runner | None = None) -> JobStatus:
    """SLURM's view of ``job_id`` now, or why it cannot be had (runs ``scontrol``)."""
    return SlurmQueue(runner).job_status(job_id)


def job_of(attempts: Iterable[Any]) -> str | None:
    """The SLURM job id of the newest attempt that recorded one (array task: ``J_T``)."""
    for a in sorted(attempts, key=lambda a: a.attempt, reverse=True):
        if a.scheduler == "slurm" and a.job_id:
            return str(a.job_id)
    return None


def parse_show_job(text: str) -> dict[str, str]:
    """The ``Key=Value`` fields of one ``scontrol show job -o`` line (values may hold ``=``)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    keys = list(_KEY.finditer(line))
    out: dict[str, str] = {}
    for i, m in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
        out.setdefault(m.group(1), line[m.end() : end].strip())
    return out


def check_job_id(job_id: str) -> str:
    """``job_id`` if it looks like a SLURM job id (``123`` or ``123_4``); else SlurmError."""
    text = str(job_id).strip()
    if not _JOB_ID.match(text):
        raise SlurmError(
            f"{job_id!r} is not a SLURM job id; use a number such as 12345, or 12345_7 for an"
            " array task"
        )
    return text


def available(runner: Runner | None = None) -> bool:
    """Whether ``scontrol`` exists here (it may still fail to reach a controller)."""
    return runner is not None or shutil.which("scontrol") is not None


def job_view(job_id: str, *, runner: Runner | None = None) -> JobView | None:
    """SLURM's view of ``job_id``; None when SLURM does not know it (finished and purged)."""
    job = check_job_id(job_id)
    rc, out = _call(["scontrol", "show", "job", "-o", job], runner)
    if rc != 0:
        if _UNKNOWN_JOB in out:
            return None
        raise SlurmError(
            f"slurm job {job}: `scontrol show job {job}` failed (exit {rc}): {_tail(out)}"
        )
    fields = parse_show_job(out)
    if "JobState" not in fields:
        raise SlurmError(f"slurm job {job}: `scontrol show job` printed no JobState: {_tail(out)}")
    requeue = fields.get("Requeue")
    restarts = fields.get("Restarts", "")
    state, reason = fields["JobState"], fields.get("Reason", "")
    return JobView(
        job_id=job,
        state=state,
        reason=reason,
        requeue=None if requeue not in ("0", "1") else requeue == "1",
        restarts=int(restarts) if restarts.isdigit() else None,
        pending=state == "PENDING",
        held=state == "PENDING" and reason in HOLD_REASONS,
        finished=state in FINISHED_STATES,
        requeue_off="off (Requeue=0)",
        fields=fields,
    )


def verify_job(
    job_id: str,
    *,
    run_root: str | os.PathLike[str] | None = None,
    runner: Runner | None = None,
) -> JobView | None:
    """SLURM's view of ``job_id`` if ckptdash may act on it; :class:`SlurmRefused` if not.

    The rule, for every action (watch's ``--on``, the dashboard's buttons, the CLI):

    * SLURM's answer is about this very job (``JobId``, or ``ArrayJobId_ArrayTaskId`` for an
      array task, equals ``job_id``), and its ``UserId`` is the acting user (the effective uid
      of this process): ckptdash never uses an operator's rights on someone else's job;
    * with ``run_root`` (the job id was read from that run's log), the run itself started the
      job: a ``run_started`` naming it opens a rank-0 event file owned by the job's user, in an
      ``events/`` folder owned by the job's user (see :mod:`ckptdash.schedulers.evidence`). A group
      member can write a log naming any job, but cannot make a file that the owner owns.

    ``run_root=None`` is for a job the user named on the command line (``--job``): only the
    first rule applies. None (nothing refused, nothing to act on): SLURM does not know the job.
    """
    job = check_job_id(job_id)
    view = job_view(job, runner=runner)
    if view is None:
        return None
    why = refusal(view, run_root=run_root)
    if why:
        raise SlurmRefused(why)
    return view


def refusal(view: JobView, *, run_root: str | os.PathLike[str] | None = None) -> str:
    """Why ckptdash may not act on the job SLURM described as ``view`` ("" when it may): the
    rule of :func:`verify_job`, for a view already asked for (the dashboard's refresh)."""
    job, fields = view.job_id, view.fields
    array = f"{fields.get('ArrayJobId', '')}_{fields.get('ArrayTaskId', '')}"
    if job not in (fields.get("JobId"), array):
        return (
            f"slurm job {job}: `scontrol show job {job}` answered about job"
            f" {fields.get('JobId', '?')}: not acting on it"
        )
    match = _USER_ID.match(fields.get("UserId", ""))
    if match is None:
        return (
            f"slurm job {job}: SLURM did not say whose job it is (UserId"
            f" {fields.get('UserId', 'missing')!r}): not acting on it"
        )
    return evidence.refusal("slurm", job, match.group(1), int(match.group(2)), run_root)


def hold(job_id: str, *, runner: Runner | None = None) -> JobView:
    """Hold a pending job (e.g. requeued and waiting) so it does not start; see :func:`release`.

    A job still being requeued (COMPLETING) is waited for, up to :data:`SETTLE_S`.
    """
    view = _settled(job_id, runner, "hold")
    if view.held:
        return view
    if not view.pending:
        raise SlurmError(
            f"slurm job {view.job_id} is {view.state}: only a job waiting in the queue can be"
            " held; to keep a running job from being requeued use `ckptdash requeue RUN_DIR"
            " --suspend`"
        )
    _must(["scontrol", "hold", view.job_id], runner, view.job_id)
    after = _known(view.job_id, runner, "hold")
    if not after.pending:
        # The scheduler started it between the look and the hold (seen on a busy cluster:
        # RUNNING, Reason=JobHeldAdmin). A hold left on a running job would silently keep its
        # next requeue waiting: take it back and say what happened.
        rc, _ = _call(["scontrol", "release", view.job_id], runner)
        undone = (
            "the hold was taken back"
            if rc == 0
            else f"`scontrol release {view.job_id}` failed: release it by hand"
        )
        raise SlurmError(
            f"slurm job {view.job_id} is {after.state}: it started before the hold took effect"
            f" ({undone}); to keep a running job from being requeued use"
            " `ckptdash requeue RUN_DIR --suspend`"
        )
    return after


def release(job_id: str, *, runner: Runner | None = None) -> JobView:
    """Release a held job: it is scheduled again (a job that is not held is left alone)."""
    view = _known(job_id, runner, "release")
    if not view.held:
        return view
    _must(["scontrol", "release", view.job_id], runner, view.job_id)
    return _known(view.job_id, runner, "release")


def cancel_pending(job_id: str, *, runner: Runner | None = None) -> JobView | None:
    """Cancel the job if, and only if, it is waiting in the queue (held or not).

    A job still being requeued (COMPLETING) is waited for, up to :data:`SETTLE_S`.
    """
    view = _settled(job_id, runner, "cancel")
    if not view.pending:
        raise SlurmError(
            f"slurm job {view.job_id} is {view.state}: --cancel-pending only cancels a job"
            " waiting in the queue; stop a running one with `ckptdash stop RUN_DIR --yes`"
            " (it saves first)"
        )
    # --state=PENDING: SLURM itself refuses if the job started since we looked.
    _must(["scancel", "--state=PENDING", view.job_id], runner, view.job_id)
    after = job_view(view.job_id, runner=runner)
    if after is not None and not after.finished:
        raise SlurmError(
            f"slurm job {view.job_id} is {after.state} after `scancel --state=PENDING`: it"
            " started before the cancel arrived; stop it with `ckptdash stop RUN_DIR --yes`"
        )
    return after


def set_requeue(job_id: str, allowed: bool, *, runner: Runner | None = None) -> JobView | None:
    """Set the job's Requeue flag; None (nothing done) when SLURM no longer knows the job.

    A finished job is left alone. ``allowed=False`` makes SLURM refuse to requeue the job,
    whoever asks (ckptdash, an operator, a preemption).
    """
    view = job_view(job_id, runner=runner)
    if view is None or view.finished:
        return view
    if view.requeue is allowed:
        return view
    flag = "1" if allowed else "0"
    _must(["scontrol", "update", f"JobId={view.job_id}", f"Requeue={flag}"], runner, view.job_id)
    return job_view(view.job_id, runner=runner)


def mirror_requeue(job_id: str, allowed: bool, *, runner: Runner | None = None) -> str:
    """Copy ckptdash's requeue setting onto the job (Requeue=1/0); one line saying what
    happened, for the CLI and the dashboard after they changed the run's setting.

    Where SLURM cannot be asked (:class:`SlurmUnavailable`) the line says the flag is not set:
    the run's own setting still holds for the job's signal handler. A refusal raises
    :class:`SlurmError` naming the command to retry by hand.
    """
    flag = "1" if allowed else "0"
    try:
        view = set_requeue(job_id, allowed, runner=runner)
    except SlurmUnavailable as exc:
        return f"slurm job {job_id}: Requeue={flag} not set: {exc}"
    except SlurmError as exc:
        what = "on" if allowed else "suspended"
        raise SlurmError(
            f"{exc}; the run's setting is changed (auto-requeue {what}) but the job's Requeue"
            f" flag is not: retry, or run `scontrol update JobId={job_id} Requeue={flag}`"
        ) from None
    if view is None:
        return f"slurm job {job_id}: no longer known to SLURM; nothing to mirror"
    if view.finished:
        return f"slurm job {job_id}: {view.state}; nothing to mirror"
    return f"slurm job {job_id}: Requeue={flag} ({view.describe()})"


def run_command(argv: list[str], job_id: str, *, runner: Runner | None = None) -> str:
    """Run one SLURM command about ``job_id`` (``ckptdash watch``'s actions: ``scontrol
    requeue``, ``scancel``, ``scontrol requeuehold``); its output, or :class:`SlurmError`
    naming the command, its exit status and SLURM's answer."""
    return _must(argv, runner, check_job_id(job_id))


# --- running commands ------------------------------------------------------------------------


def _known(job_id: str, runner: Runner | None, what: str) -> JobView:
    view = job_view(job_id, runner=runner)
    if view is None:
        raise SlurmError(
            f"slurm job {check_job_id(job_id)}: SLURM does not know this job (it ended and was"
            f" purged, or the id is wrong); nothing to {what}. `squeue --me` lists your jobs"
        )
    return view


def _settled(job_id: str, runner: Runner | None, what: str) -> JobView:
    """The job's view once it is out of a transition (a requeued job's processes ending)."""
    deadline = time.monotonic() + SETTLE_S
    view = _known(job_id, runner, what)
    while view.state in _TRANSIENT and time.monotonic() < deadline:
        _sleep(0.25)
        view = _known(job_id, runner, what)
    return view


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def _must(argv: list[str], runner: Runner | None, job: str) -> str:
    rc, out = _call(argv, runner)
    if rc != 0:
        raise SlurmError(f"slurm job {job}: `{shlex.join(argv)}` failed (exit {rc}): {_tail(out)}")
    return out


def _call(argv: list[str], runner: Runner | None) -> tuple[int, str]:
    run = runner if runner is not None else subprocess_runner
    try:
        rc, out = run(argv, TIMEOUT_S)
    except FileNotFoundError:
        raise SlurmUnavailable(
            f"{argv[0]} is not on PATH: SLURM's client commands are needed for the scheduler's"
            " view (run this on a login node of the cluster)"
        ) from None
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(
            f"`{shlex.join(argv)}` took more than {TIMEOUT_S:.0f} s: the SLURM controller does"
            " not answer; try again, or check `scontrol ping`"
        ) from None
    except OSError as exc:
        raise SlurmUnavailable(f"{argv[0]}: cannot run it: {exc.strerror or exc}") from None
    if rc != 0 and any(marker in out for marker in _UNAVAILABLE):
        raise SlurmUnavailable(
            f"`{shlex.join(argv)}` cannot reach SLURM: {_tail(out)} (set SLURM_CONF or run this"
            " on a login node of the cluster)"
        )
    return rc, out


def _tail(out: str) -> str:
    return tail(out)


class SlurmQueue(Queue):
    """SLURM's login-node side behind :class:`~ckptdash.schedulers.base.Queue`."""

    name = "slurm"
    label = "SLURM"
    hold_command = "scontrol hold"
    release_command = "scontrol release"
    cancel_command = "scancel --state=PENDING"
    switch_name = "Requeue"

    def available(self) -> bool:
        return available(self.runner)

    def missing(self) -> str:
        return "scontrol is not on PATH"

    def switch(self, allowed: bool) -> str:
        return "Requeue=1" if allowed else "Requeue=0"

    def check_job_id(self, job_id: str) -> str:
        return check_job_id(job_id)

    def job_view(self, job_id: str) -> JobView | None:
        return job_view(job_id, runner=self.runner)

    def refusal(self, view: JobView, *, run_root: str | os.PathLike[str] | None = None) -> str:
        return refusal(view, run_root=run_root)

    def verify_job(
        self, job_id: str, *, run_root: str | os.PathLike[str] | None = None
    ) -> JobView | None:
        return verify_job(job_id, run_root=run_root, runner=self.runner)

    def hold(self, job_id: str) -> JobView:
        return hold(job_id, runner=self.runner)

    def release(self, job_id: str) -> JobView:
        return release(job_id, runner=self.runner)

    def cancel_pending(self, job_id: str) -> JobView | None:
        return cancel_pending(job_id, runner=self.runner)

    def mirror_requeue(self, job_id: str, allowed: bool) -> str:
        return mirror_requeue(job_id, allowed, runner=self.runner)

    ACT_COMMANDS: ClassVar[dict[str, str]] = {
        "requeue": "scontrol requeue",
        "cancel": "scancel",
        "hold": "scontrol hold",
    }

    def act(self, action: str, view: JobView) -> tuple[str, str]:
        job = view.job_id
        if action == "requeue":
            argv = ["scontrol", "requeue", job]
        elif action == "cancel":
            argv = ["scancel", job]
        else:
            if view.finished:
                raise SlurmError(f"slurm job {job}: not held: the job is {view.state}")
            if view.held:
                return f"scontrol hold {job}", "already held"
            if view.state != "RUNNING":
                # Pending, or between attempts (COMPLETING, REQUEUED): hold() waits for it.
                return f"scontrol hold {job}", f"held; now {self.hold(job).describe()}"
            # A running attempt of a crash loop: requeue it held, so no further attempt starts.
            argv = ["scontrol", "requeuehold", job]
        out = run_command(argv, job, runner=self.runner)
        what = f"done{': ' + out if out else ''}"
        after = self.job_view(job) if action != "cancel" else None
        if after is not None:
            what += f"; now {after.describe()}"
        return shlex.join(argv), what
