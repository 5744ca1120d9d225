"""Grid Engine (Son of Grid Engine, OGS, Univa/Altair) inside a job.

* Detected from ``JOB_ID`` with ``SGE_ROOT`` or ``SGE_CELL`` (every job has them).
* The job id is ``JOB_ID``, or ``JOB_ID.SGE_TASK_ID`` for an array task (``SGE_TASK_ID`` is
  ``undefined`` outside arrays); ``qmod -rj 12.3`` reschedules that task only.
* Attempts are counted in the run directory: ``RESTARTED`` is 1 on every rerun (a flag, not
  a count) and no variable counts restarts.
* Signals: with ``qsub -notify``, SIGUSR2 precedes *every* kill (``qdel``, a reschedule, the
  hard limit ``h_rt``) and SIGUSR1 every suspend (``qmod -sj``, a subordinate queue), and
  the soft limit ``s_rt`` sends SIGUSR1 too. SIGUSR1's default action ends Python, so it is
  handled here (recorded: a suspend only stops the process, and it goes on after ``qmod
  -usj``); map it to ``requeue`` in ``TrainConfig.signals`` for an ``s_rt`` soft limit.
* A SIGUSR2 does not say whether the job will run again; the job's state in ``qstat`` does:
  ``d`` (``dr``: being deleted) after a ``qdel``. Then :meth:`GridEngineScheduler.cancelled`
  says so, and the job is saved and not requeued.
* Requeue inside the job is Grid Engine's own rerun: the attempt saves and ends the process
  with exit status 99 (:mod:`ckptdash.train.ending.exit_status`), which Grid Engine reruns
  (even with ``-r n``, so ckptdash refuses itself where the job says ``restart: n``: submitted
  with ``-r n`` or switched by ``qalter -r n`` / ``ckptdash requeue --suspend``). No ``qmod
  -rj`` is pushed from inside: measured on the tier's cell, qmaster then keeps the old run on
  the host's reschedule list for about two execd reports, an end reported outside that window
  is taken as the job's own (exit 0 is not rerun, the kill at the end of the notify time is
  ``failed 100 : assumedly after job``), the kill order itself was seen lost under load, and
  a 2-rank parallel environment job requeued that way stayed in ``Rt`` for good (execd could
  not reap its ``qrsh -inherit`` task). A reschedule from outside (an operator's ``qmod
  -rj``, ``ckptdash watch``: :mod:`ckptdash.schedulers.gridengine_queue`) shows as ``R`` in
  the job's state; the attempt then exits 99 too. The batch script must ``exec`` Python (or
  pass its status on).
* Time left: no variable gives it; ``qstat -xml -j JOB`` has the start time and the ``h_rt``
  request, read once.

The login-node side (hold, release, cancel, ``qalter -r``) is
:mod:`ckptdash.schedulers.gridengine_queue`.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Mapping

from ckptdash.schedulers.base import (
    RequeueResult,
    Runner,
    Scheduler,
    SignalMeaning,
    subprocess_runner,
)

TRANSFER_S = 30.0
"""Longest wait for qmaster to have the job running (``r``, not ``t``) before an operator's
``qmod -rj`` (:mod:`ckptdash.schedulers.gridengine_queue`): on the tier's busy cell a reschedule
of a job still in transfer lost its kill order (no notify, no kill, no rerun)."""

RERUN_EXIT = 99
"""The exit status Grid Engine reruns a job by (even with ``-r n``, unless the cell's
``qmaster_params`` say ``FORBID_RESCHEDULE``)."""

RESCHEDULED = "Pushed rescheduling of"
"""What ``qmod -rj`` prints when it did reschedule the job (or task)."""

RERUN = f"exit {RERUN_EXIT}"
"""The requeue command a Grid Engine attempt records (``requeue_issued``'s ``command``)."""


def detected(env: Mapping[str, str]) -> bool:
    """Inside a Grid Engine job: ``JOB_ID`` and the cell's variables."""
    return bool(env.get("JOB_ID")) and bool(env.get("SGE_ROOT") or env.get("SGE_CELL"))


def task_id(env: Mapping[str, str]) -> str | None:
    """The array task number, or None outside arrays (``SGE_TASK_ID=undefined``)."""
    task = env.get("SGE_TASK_ID", "")
    return task if task.isdigit() else None


def requeue_ok(returncode: int | None, output: str) -> bool:
    """Whether ``qmod -rj`` rescheduled: exit 0 *and* its "Pushed rescheduling" line (it exits
    0 when it refuses a job that is not restartable or is being deleted)."""
    return returncode == 0 and RESCHEDULED in output


def state_of(qstat_output: str, job: str, task: str | None) -> str | None:
    """The state column (``r``, ``dr``, ``Rq``, ``hqw``, ...) of ``job`` (and array ``task``)
    in plain ``qstat`` output; None when it is not listed."""
    for line in qstat_output.splitlines():
        cols = line.split()
        if len(cols) < 5 or cols[0] != job:
            continue
        if task is not None and not _has_task(cols[-1], task):
            continue
        return cols[4]
    return None


def _has_task(column: str, task: str) -> bool:
    """Whether a ja-task-ID column (``3``, ``1-4:1``, ``1,3``) includes ``task``."""
    n = int(task)
    for part in column.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part)
        if m is None:
            continue
        lo = int(m.group(1))
        hi = int(m.group(2) or lo)
        step = int(m.group(3) or 1)
        if lo <= n <= hi and (n - lo) % step == 0:
            return True
    return False


def restart_flag(xml: str) -> str | None:
    """The job's ``-r`` flag from ``qstat -xml -j JOB``: ``"y"``, ``"n"``, or None where the
    job left it to the queue (``JB_restart`` 0) or the answer does not say."""
    found = re.search(r"<JB_restart>(\d+)</JB_restart>", xml)
    if found is None:
        return None
    return {"1": "y", "2": "n"}.get(found.group(1))


def parse_time_left(xml: str, now: float) -> float | None:
    """Seconds left before ``h_rt`` from ``qstat -xml -j JOB``: the request's value minus the
    time since ``JAT_start_time``; None without an ``h_rt`` request or a start time."""
    limit = re.search(
        r"<CE_name>h_rt</CE_name>.*?<CE_doubleval>([0-9.]+)</CE_doubleval>", xml, re.S
    )
    start = re.search(r"<JAT_start_time>(\d+)</JAT_start_time>", xml)
    if limit is None or start is None:
        return None
    started = int(start.group(1))
    if started > 10**11:  # some versions print milliseconds
        started //= 1000
    return max(0.0, float(limit.group(1)) - (now - started))


class GridEngineScheduler(Scheduler):
    """Grid Engine: ``qmod -rj`` of this job (or array task), judged by its output."""

    name = "gridengine"

    def __init__(self, environ: Mapping[str, str] | None = None, runner: Runner | None = None):
        super().__init__(environ)
        self.runner: Runner = runner or subprocess_runner
        self._end_time: float | None = None
        self._end_time_read = False

    @property
    def job_id(self) -> str | None:
        job = self.env.get("JOB_ID")
        if not job:
            return None
        task = task_id(self.env)
        return f"{job}.{task}" if task else job

    @property
    def attempt(self) -> int | None:
        return None  # RESTARTED is a flag: count attempts in the run directory

    @property
    def signals(self) -> dict[str, SignalMeaning]:
        return {"SIGUSR1": "ignore"}

    @property
    def can_requeue(self) -> bool:
        return self.job_id is not None

    def _ask(self, argv: list[str]) -> tuple[int, str] | None:
        try:
            return self.runner(argv, 10.0)
        except (OSError, subprocess.TimeoutExpired):
            return None

    def time_left_s(self) -> float | None:
        if not self._end_time_read:
            self._end_time_read = True
            job = self.env.get("JOB_ID")
            answer = self._ask(["qstat", "-xml", "-j", job]) if job else None
            if answer is not None and answer[0] == 0:
                now = time.time()
                left = parse_time_left(answer[1], now)
                self._end_time = None if left is None else now + left
        return None if self._end_time is None else max(0.0, self._end_time - time.time())

    def cancelled(self) -> str:
        job = self.env.get("JOB_ID")
        if not job:
            return ""
        answer = self._ask(["qstat", "-u", "*"])
        if answer is None or answer[0] != 0:
            return ""
        state = state_of(answer[1], job, task_id(self.env))
        if state is not None and "d" in state:
            return f"qdel: Grid Engine job {self.job_id} is being deleted (qstat state {state})"
        return ""

    def requeue(self) -> RequeueResult:
        """Ask for exit status 99 as the attempt ends (see the module's docstring), unless the
        job is being deleted or says ``restart: n``; nothing is run but ``qstat``."""
        job = self.job_id
        if job is None:
            return RequeueResult(False, RERUN, None, "JOB_ID is not set; not inside a job")
        state = self._state()
        if state is not None and "d" in state:
            return RequeueResult(
                False, RERUN, None, f"job {job} is being deleted (qstat state {state})"
            )
        answer = self._ask(["qstat", "-xml", "-j", self.env.get("JOB_ID", "")])
        if answer is not None and answer[0] == 0 and restart_flag(answer[1]) == "n":
            return RequeueResult(
                False,
                RERUN,
                None,
                f"job {job} is not restartable (restart: n, from `qsub -r n`, `qalter -r n` or"
                f" `ckptdash requeue --suspend`): `qalter -r y {job}` allows it",
            )
        self.exit_status = RERUN_EXIT
        under_way = state is not None and "R" in state and self.env.get("RESTARTED", "0") == "0"
        why = f"already being rescheduled (qstat state {state}); " if under_way else ""
        return RequeueResult(True, RERUN, 0, f"{why}Grid Engine reruns a job that exits 99")

    def _state(self) -> str | None:
        answer = self._ask(["qstat", "-u", "*"])
        if answer is None or answer[0] != 0:
            return None
        return state_of(answer[1], self.env.get("JOB_ID", ""), task_id(self.env))
