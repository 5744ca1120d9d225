"""What every scheduler answers, from inside a job and from a login node.

Inside a job (:class:`Scheduler`): who it is (detection happens in
:func:`ckptdash.schedulers.detect`), the job id, the attempt number it counts, what each
signal means there, the time left, how to requeue and whether that worked, and whether the
job is being cancelled rather than requeued when a signal arrives. The job environment is
read-only properties over environment variables (read in the scheduler's module and nowhere
else); a requeue runs one command and reports its exit status and output, so a failed
requeue becomes an event instead of a lost stderr line.

From a login node (:class:`Queue`): the scheduler's view of one job (:class:`JobView`,
:class:`JobStatus`), the checks before acting on it, hold / release / cancel of a pending job,
and the job's own requeue switch. The dashboard, the CLI and ``ckptdash watch`` use only this
interface; each scheduler's ``*_queue`` module implements it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

SignalMeaning = Literal["requeue", "terminate", "ignore"]
"""The same words as :data:`ckptdash.train.config.SignalAction`."""


@dataclass(frozen=True, slots=True)
class RequeueResult:
    """Outcome of one requeue command: ``ok`` is the scheduler's judgement, which for some
    schedulers is read from the output (Grid Engine's ``qmod -rj`` exits 0 when it refuses)."""

    ok: bool
    command: str
    returncode: int | None
    output: str


class Scheduler:
    """The job side of a scheduler. This base is no scheduler at all (a local run): nothing to
    requeue; the attempt comes from ``CKPTDASH_ATTEMPT`` if set, else from the run dir."""

    name = "local"

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.env = dict(os.environ if environ is None else environ)
        self.exit_status: int | None = None
        """The process's exit status this scheduler reruns a requeued job by (Grid Engine: 99),
        set by :meth:`requeue`; the session asks for it as the attempt ends (rank 0)."""

    @property
    def job_id(self) -> str | None:
        return self.env.get("CKPTDASH_JOB_ID")

    @property
    def attempt(self) -> int | None:
        """The attempt number the scheduler knows, or None to count attempts in the run dir."""
        value = self.env.get("CKPTDASH_ATTEMPT")
        return int(value) if value and value.isdigit() else None

    @property
    def signals(self) -> dict[str, SignalMeaning]:
        """What signals mean under this scheduler beyond ckptdash's defaults (USR2 requeue,
        TERM terminate); ``TrainConfig.signals`` overrides any of them. A signal listed here
        is handled (recorded), so its default action never ends the job."""
        return {}

    def time_left_s(self) -> float | None:
        """Seconds until the job's time limit, or None when there is none (or none known)."""
        return None

    @property
    def can_requeue(self) -> bool:
        return False

    def cancelled(self) -> str:
        """Asked at signal time, before a requeue: why the job is being cancelled rather than
        requeued ("" when it is not, or the scheduler cannot say). A cancelled job is saved and
        not requeued, and its attempt ends as terminated."""
        return ""

    def requeue(self) -> RequeueResult:
        return RequeueResult(False, "", None, "no scheduler to requeue with (local run)")


# A requeue makes the scheduler signal every process of the job, this command included, which
# may still be finishing (the requeue done, its reply on the way): killed, it would turn a
# successful requeue into a reported failure (measured with SLURM: `scontrol requeue` exit
# -15). So it runs with SIGTERM ignored, which exec keeps; the scheduler's SIGKILL still ends it.
_IGNORE_SIGTERM = ["/bin/sh", "-c", 'trap "" TERM; exec "$@"', "sh"]


def run_command(argv: list[str], timeout_s: float = 60.0) -> RequeueResult:
    """Run a requeue command (SIGTERM ignored); never raises, the result says what happened
    (``ok`` here is exit status 0; a scheduler that knows better judges the output)."""
    text = shlex.join(argv)
    if shutil.which(argv[0]) is None:
        return RequeueResult(False, text, None, f"{argv[0]}: command not found on PATH")
    launch = _IGNORE_SIGTERM + argv if os.path.exists(_IGNORE_SIGTERM[0]) else argv
    try:
        proc = subprocess.run(
            launch, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except FileNotFoundError:
        return RequeueResult(False, text, None, f"{argv[0]}: command not found on PATH")
    except subprocess.TimeoutExpired:
        return RequeueResult(False, text, None, f"timed out after {timeout_s:.0f} s")
    output = (proc.stdout + proc.stderr).strip()[-2000:]
    return RequeueResult(proc.returncode == 0, text, proc.returncode, output)


# --- the login-node side ---------------------------------------------------------------------

Runner = Callable[[Sequence[str], float], tuple[int, str]]
"""Runs argv with a timeout; returns (exit status, stdout+stderr). Raises OSError if absent."""


def subprocess_runner(argv: Sequence[str], timeout_s: float) -> tuple[int, str]:
    """The real :data:`Runner`: the command's exit status and its output, stripped."""
    proc = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout_s, check=False
    )
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def tail(out: str) -> str:
    """The last non-empty line of a command's output (at most 300 characters)."""
    lines = [line.strip() for line in out.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "no output")[-300:]


@dataclass(frozen=True)
class JobView:
    """What the scheduler says about one job right now, in the scheduler's own words
    (``state``, ``reason``) and in ckptdash's (``pending``, ``held``, ``finished``)."""

    job_id: str
    state: str
    reason: str
    requeue: bool | None
    restarts: int | None
    pending: bool = False
    held: bool = False
    finished: bool = False
    requeue_off: str = "off"
    """How the job's requeue switch reads when off (``off (Requeue=0)``, ``off (-r n)``)."""
    fields: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def running(self) -> bool:
        """Neither waiting in the queue nor ended."""
        return not self.pending and not self.finished

    def describe(self) -> str:
        """One line: ``PENDING (JobHeldAdmin), held, requeue on, restarts 1``."""
        reason = self.reason
        parts = [self.state + (f" ({reason})" if reason not in ("", "None") else "")]
        if self.held:
            parts.append("held")
        if self.requeue is not None:
            parts.append("requeue " + ("on" if self.requeue else self.requeue_off))
        if self.restarts is not None:
            parts.append(f"restarts {self.restarts}")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "state": self.state,
            "reason": self.reason,
            "held": self.held,
            "requeue": self.requeue,
            "restarts": self.restarts,
        }


@dataclass(frozen=True)
class JobStatus:
    """What ckptdash knows about one run's job: the scheduler's view, or why there is none.

    ``ckptdash status`` prints it (:meth:`describe`, :meth:`to_dict` for ``--json``) and the
    dashboard's scheduler panel shows it; :meth:`Queue.job_status` asks for one.
    """

    job_id: str | None = None
    """None: no scheduler job (the dashboard hides its panel)."""
    asked: bool = False
    """True once the scheduler answered (or said why it cannot) for this job."""
    view: JobView | None = None
    """The scheduler's view; None when unasked, unavailable, or the job is forgotten."""
    unavailable: str = ""
    """Why the scheduler's commands cannot be used from here (then every control is off)."""
    error: str = ""
    """Why asking about this one job failed."""
    refused: str = ""
    """Why ckptdash will not act on this job (:meth:`Queue.refusal`): every control is off."""
    scheduler: str = "slurm"
    """Which scheduler (``slurm``, ``gridengine``)."""
    label: str = "SLURM"
    """How people write its name."""

    @property
    def can_hold(self) -> bool:
        return self._actable and self.view is not None and self.view.pending and not self.view.held

    @property
    def can_release(self) -> bool:
        return self._actable and self.view is not None and self.view.held

    @property
    def can_cancel(self) -> bool:
        return self._actable and self.view is not None and self.view.pending

    @property
    def _actable(self) -> bool:
        return not self.refused

    def key(self) -> tuple[object, ...]:
        """What is shown (not e.g. a run time, which changes every second)."""
        shown = None if self.view is None else tuple(self.view.to_dict().items())
        return (
            self.scheduler,
            self.job_id,
            self.asked,
            shown,
            self.unavailable,
            self.error,
            self.refused,
        )

    def describe(self) -> str:
        """``ckptdash status``'s line: ``scheduler: slurm job 77: PENDING (...), held, ...``."""
        head = f"scheduler: {self.scheduler} job {self.job_id}: "
        if self.unavailable or self.error:
            return head + f"unknown here ({self.unavailable or self.error})"
        if self.view is None:
            return head + f"no longer known to {self.label} (ended and purged)"
        return head + self.view.describe()

    def to_dict(self) -> dict[str, Any]:
        """``ckptdash status --json``'s ``scheduler``: ``{"scheduler": "slurm", "job_id",
        "known": bool, "state", "reason", "held", "requeue", "restarts"}``, or ``{"scheduler",
        "job_id", "error": "..."}`` when the scheduler could not be asked."""
        base: dict[str, Any] = {"scheduler": self.scheduler, "job_id": self.job_id}
        if self.unavailable or self.error:
            return {**base, "error": self.unavailable or self.error}
        if self.view is None:
            return {**base, "known": False}
        return {**base, "known": True, **self.view.to_dict()}


class Queue:
    """The login-node side of one scheduler; each ``*_queue`` module has one subclass.

    Every method raises :class:`ckptdash.errors.SchedulerError` (one line naming the job and the
    fix) or :class:`~ckptdash.errors.SchedulerUnavailable` (the commands cannot be used here).
    ``runner`` replaces the scheduler's commands (tests).
    """

    name = "none"
    label = "no scheduler"
    hold_command = ""
    """The command :meth:`hold` runs, as the CLI and dashboard name it (``scontrol hold``)."""
    release_command = ""
    cancel_command = ""
    switch_name = ""
    """The job's own requeue switch that :meth:`mirror_requeue` sets (``Requeue``, ``-r``)."""

    def __init__(self, runner: Runner | None = None) -> None:
        self.runner = runner

    def available(self) -> bool:
        """Whether the scheduler's client commands exist here (they may still fail)."""
        raise NotImplementedError

    def missing(self) -> str:
        """Why :meth:`available` is false, in a few words (``scontrol is not on PATH``)."""
        raise NotImplementedError

    def switch(self, allowed: bool) -> str:
        """The switch's setting as the scheduler writes it (``Requeue=1``, ``-r y``)."""
        raise NotImplementedError

    def check_job_id(self, job_id: str) -> str:
        """``job_id`` if it has this scheduler's form; else SchedulerError saying the form."""
        raise NotImplementedError

    def job_view(self, job_id: str) -> JobView | None:
        """The scheduler's view of the job; None when it no longer knows it."""
        raise NotImplementedError

    def job_status(self, job_id: str) -> JobStatus:
        """The scheduler's view of ``job_id`` now, or why it cannot be had."""
        from ckptdash.errors import SchedulerError, SchedulerUnavailable

        def status(**kw: Any) -> JobStatus:
            return JobStatus(job_id, asked=True, scheduler=self.name, label=self.label, **kw)

        try:
            view = self.job_view(job_id)
        except SchedulerUnavailable as exc:
            return status(unavailable=str(exc))
        except SchedulerError as exc:
            return status(error=str(exc))
        return status(view=view)

    def unavailable_status(self, job_id: str, why: str) -> JobStatus:
        """A status for a job the scheduler cannot be asked about (``why``)."""
        return JobStatus(job_id, asked=True, unavailable=why, scheduler=self.name, label=self.label)

    def refusal(self, view: JobView, *, run_root: str | os.PathLike[str] | None = None) -> str:
        """Why ckptdash may not act on the job described as ``view`` ("" when it may): it must
        run as the acting user and, with ``run_root`` (the id came from that run's log), the
        run's own files must vouch for it (:mod:`ckptdash.schedulers.evidence`)."""
        raise NotImplementedError

    def verify_job(
        self, job_id: str, *, run_root: str | os.PathLike[str] | None = None
    ) -> JobView | None:
        """The view of ``job_id`` if ckptdash may act on it; SchedulerRefused if not; None when
        the scheduler does not know the job (nothing refused, nothing to act on)."""
        from ckptdash.errors import SchedulerRefused

        view = self.job_view(self.check_job_id(job_id))
        if view is None:
            return None
        why = self.refusal(view, run_root=run_root)
        if why:
            raise SchedulerRefused(why)
        return view

    def hold(self, job_id: str) -> JobView:
        """Hold a pending (e.g. requeued) job so it does not start; see :meth:`release`."""
        raise NotImplementedError

    def release(self, job_id: str) -> JobView:
        """Release a held job: it is scheduled again (one not held is left alone)."""
        raise NotImplementedError

    def cancel_pending(self, job_id: str) -> JobView | None:
        """Cancel the job if, and only if, it waits in the queue (held or not)."""
        raise NotImplementedError

    ACT_COMMANDS: ClassVar[dict[str, str]] = {}
    """The command of each ``ckptdash watch --on`` action (``requeue``, ``cancel``, ``hold``)."""

    def act_command(self, action: str, job_id: str) -> str:
        """The command :meth:`act` runs for ``action`` (``requeue``, ``cancel``, ``hold``), as
        ``ckptdash watch`` shows it when nothing ran (``scontrol requeue 77``, ``qdel 12``)."""
        return f"{self.ACT_COMMANDS[action]} {job_id}"

    def act(self, action: str, view: JobView) -> tuple[str, str]:
        """Carry out a ``ckptdash watch --on`` rule's ``action`` on the job ``view`` describes
        (already verified: :meth:`verify_job`): ``requeue`` it, ``cancel`` it, or ``hold``
        it (a running attempt requeued held, a pending job held, a held one left alone).
        Returns (the command run, what happened); SchedulerError when it was refused or
        failed, naming the job and the fix."""
        raise NotImplementedError

    def mirror_requeue(self, job_id: str, allowed: bool) -> str:
        """Copy ckptdash's requeue setting onto the job's own requeue switch, so that a kill
        without a usable signal does not requeue it either; one line saying what happened.
        Where the scheduler cannot be asked, the line says the switch is not set."""
        raise NotImplementedError
