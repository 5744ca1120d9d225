"""Grid Engine's side of a run, from a submit host: the job's state, and the controls only
Grid Engine can carry out.

* :meth:`GridEngineQueue.job_view` — state (``qstat``'s column: ``qw``, ``hqw``, ``Rq``,
  ``r``, ``dr``, ``Eqw``, ...), the ``-r`` flag, owner (``qstat -xml -j``); None once Grid
  Engine has forgotten the job (it forgets a finished job at once);
* ``hold`` / ``release`` — ``qhold`` / ``qrls`` of a pending job (also a rescheduled ``Rq``);
* ``cancel_pending`` — ``qdel`` of a job only while it waits in the queue;
* ``act`` — ``ckptdash watch --on`` rules: ``qmod -rj`` (judged by its output), ``qdel``,
  ``qhold`` (of a running job: ``qhold`` then ``qmod -rj``, so it waits held as ``hRq``);
* ``mirror_requeue`` — ``qalter -r n`` (``-r y`` undoes it), so that Grid Engine itself
  refuses to reschedule the job (``qmod -rj`` then answers "is not restartable"). An exit 99
  still reruns the job whatever ``-r`` says; the line says so.

Job ids are ``12`` or ``12.3`` (array task 3; ``qalter`` applies to the whole job 12). Grid
Engine counts no restarts. Errors raise :class:`~ckptdash.errors.SchedulerError` naming the job
and the fix; :class:`~ckptdash.errors.SchedulerUnavailable` when its commands cannot be used.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from typing import ClassVar

from ckptdash.errors import SchedulerError, SchedulerUnavailable
from ckptdash.schedulers import evidence
from ckptdash.schedulers.base import JobView, Queue, subprocess_runner, tail
from ckptdash.schedulers.gridengine import TRANSFER_S, requeue_ok, restart_flag, state_of

TIMEOUT_S = 10.0
"""How long one Grid Engine command may take before it counts as unavailable."""

_JOB_ID = re.compile(r"^(\d+)(?:\.(\d+))?$")
_UNAVAILABLE = ("unable to contact qmaster", "cannot connect", "error: commlib error")


def _tag(xml: str, name: str) -> str | None:
    m = re.search(rf"<{name}>([^<]*)</{name}>", xml)
    return None if m is None else m.group(1)


class GridEngineQueue(Queue):
    """Grid Engine's login-node side behind :class:`~ckptdash.schedulers.base.Queue`."""

    name = "gridengine"
    label = "Grid Engine"
    hold_command = "qhold"
    release_command = "qrls"
    cancel_command = "qdel"
    switch_name = "-r"

    def available(self) -> bool:
        return self.runner is not None or shutil.which("qstat") is not None

    def missing(self) -> str:
        return "qstat is not on PATH (source $SGE_ROOT/$SGE_CELL/common/settings.sh)"

    def switch(self, allowed: bool) -> str:
        return "-r y" if allowed else "-r n"

    def check_job_id(self, job_id: str) -> str:
        text = str(job_id).strip()
        if not _JOB_ID.match(text):
            raise SchedulerError(
                f"{job_id!r} is not a Grid Engine job id; use a number such as 12345, or"
                " 12345.7 for an array task"
            )
        return text

    def _call(self, argv: list[str]) -> tuple[int, str]:
        run = self.runner if self.runner is not None else subprocess_runner
        try:
            rc, out = run(argv, TIMEOUT_S)
        except FileNotFoundError:
            raise SchedulerUnavailable(f"{argv[0]} is not on PATH: {self.missing()}") from None
        except subprocess.TimeoutExpired:
            raise SchedulerUnavailable(
                f"`{shlex.join(argv)}` took more than {TIMEOUT_S:.0f} s: qmaster does not"
                " answer; try again, or check `qstat -f`"
            ) from None
        except OSError as exc:
            raise SchedulerUnavailable(f"{argv[0]}: cannot run it: {exc.strerror or exc}") from None
        if rc != 0 and any(marker in out.lower() for marker in _UNAVAILABLE):
            raise SchedulerUnavailable(
                f"`{shlex.join(argv)}` cannot reach Grid Engine: {tail(out)} (source"
                " $SGE_ROOT/$SGE_CELL/common/settings.sh, or run this on a submit host)"
            )
        return rc, out

    def _must(self, argv: list[str], job: str) -> str:
        rc, out = self._call(argv)
        if rc != 0:
            raise SchedulerError(
                f"gridengine job {job}: `{shlex.join(argv)}` failed (exit {rc}): {tail(out)}"
            )
        return out

    def job_view(self, job_id: str) -> JobView | None:
        job = self.check_job_id(job_id)
        m = _JOB_ID.match(job)
        assert m is not None
        number, task = m.group(1), m.group(2)
        rc, xml = self._call(["qstat", "-xml", "-j", number])
        if "<unknown_jobs" in xml or "do not exist" in xml:
            return None
        if rc != 0 or _tag(xml, "JB_job_number") is None:
            raise SchedulerError(
                f"gridengine job {job}: `qstat -xml -j {number}` failed (exit {rc}): {tail(xml)}"
            )
        rc, listing = self._call(["qstat", "-u", "*"])
        state = state_of(listing, number, task) if rc == 0 else None
        if state is None:
            return None  # ended between the two questions
        restart = restart_flag(xml)
        fields = {
            "job_number": _tag(xml, "JB_job_number") or "",
            "owner": _tag(xml, "JB_owner") or "",
            "uid": _tag(xml, "JB_uid") or "",
        }
        return JobView(
            job_id=job,
            state=state,
            reason="",
            requeue=None if restart is None else restart == "y",
            restarts=None,
            pending="q" in state,
            held="h" in state,
            finished=False,
            requeue_off="off (-r n)",
            fields=fields,
        )

    def refusal(self, view: JobView, *, run_root: str | os.PathLike[str] | None = None) -> str:
        job, fields = view.job_id, view.fields
        if job.split(".")[0] != fields.get("job_number"):
            return (
                f"gridengine job {job}: `qstat -j` answered about job"
                f" {fields.get('job_number', '?')}: not acting on it"
            )
        uid = fields.get("uid", "")
        if not uid.isdigit():
            return (
                f"gridengine job {job}: Grid Engine did not say whose job it is: not acting on it"
            )
        return evidence.refusal("gridengine", job, fields.get("owner", "?"), int(uid), run_root)

    def _known(self, job_id: str, what: str) -> JobView:
        view = self.job_view(job_id)
        if view is None:
            raise SchedulerError(
                f"gridengine job {job_id}: Grid Engine does not know this job (it ended, or the"
                f" id is wrong); nothing to {what}. `qstat` lists your jobs"
            )
        return view

    def hold(self, job_id: str) -> JobView:
        view = self._known(job_id, "hold")
        if view.held:
            return view
        if not view.pending:
            raise SchedulerError(
                f"gridengine job {view.job_id} is {view.state}: only a job waiting in the queue"
                " can be held; to keep a running job from being rescheduled use `ckptdash"
                " requeue RUN_DIR --suspend`"
            )
        self._must(["qhold", view.job_id], view.job_id)
        return self._known(view.job_id, "hold")

    def release(self, job_id: str) -> JobView:
        view = self._known(job_id, "release")
        if not view.held:
            return view
        self._must(["qrls", view.job_id], view.job_id)
        return self._known(view.job_id, "release")

    def cancel_pending(self, job_id: str) -> JobView | None:
        view = self._known(job_id, "cancel")
        if not view.pending:
            raise SchedulerError(
                f"gridengine job {view.job_id} is {view.state}: --cancel-pending only cancels a"
                " job waiting in the queue; stop a running one with `ckptdash stop RUN_DIR"
                " --yes` (it saves first)"
            )
        self._must(["qdel", view.job_id], view.job_id)
        return self.job_view(view.job_id)

    ACT_COMMANDS: ClassVar[dict[str, str]] = {
        "requeue": "qmod -rj",
        "cancel": "qdel",
        "hold": "qhold",
    }

    def act(self, action: str, view: JobView) -> tuple[str, str]:
        job = view.job_id
        if action == "cancel":
            out = self._must(["qdel", job], job)
            return f"qdel {job}", f"done: {tail(out)}"
        if action == "hold":
            if view.held:
                return f"qhold {job}", "already held"
            if view.pending:
                return f"qhold {job}", f"held; now {self.hold(job).describe()}"
            # A running attempt: a hold on a running job applies to its next run, and the
            # reschedule ends this one, so the job waits held (hRq) instead of starting again.
            self._must(["qhold", job], job)
        command = f"qmod -rj {job}"
        deadline = time.monotonic() + TRANSFER_S
        while "t" in view.state and time.monotonic() < deadline:
            time.sleep(0.5)  # in transfer: a reschedule now was seen to lose its kill order
            view = self._known(job, "requeue")
        out = self._must(["qmod", "-rj", job], job)
        if not requeue_ok(0, out):
            # qmod -rj exits 0 when it refuses ("is not restartable", "already in deleted
            # state. No rescheduling!"): its output is the judge.
            raise SchedulerError(
                f"gridengine job {job}: `{command}` did not reschedule it: {tail(out)}"
                + ("; `qalter -r y` allows it again" if "not restartable" in out else "")
            )
        after = self.job_view(job)
        what = "done: " + tail(out) + (f"; now {after.describe()}" if after is not None else "")
        if action == "hold":
            return f"qhold {job}; {command}", what
        return command, what

    def mirror_requeue(self, job_id: str, allowed: bool) -> str:
        flag = self.switch(allowed)
        job = self.check_job_id(job_id)
        number = job.split(".")[0]
        try:
            view = self.job_view(job)
            if view is None:
                return f"gridengine job {job}: no longer known to Grid Engine; nothing to mirror"
            if view.requeue is not allowed:
                self._must(["qalter", *flag.split(), number], job)
                view = self._known(job, "mirror") if allowed else view
        except SchedulerUnavailable as exc:
            return f"gridengine job {job}: {flag} not set: {exc}"
        except SchedulerError as exc:
            what = "on" if allowed else "suspended"
            raise SchedulerError(
                f"{exc}; the run's setting is changed (auto-requeue {what}) but the job's -r"
                f" flag is not: retry, or run `qalter {flag} {number}`"
            ) from None
        said = f"gridengine job {job}: qalter {flag} {number} (Grid Engine "
        said += "may reschedule it again)" if allowed else "will not reschedule it)"
        if not allowed:
            said += "; an exit 99 still reruns it"
        return said
