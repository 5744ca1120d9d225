"""Schedulers behind one small interface: detect, job id, attempt, time left, requeue.

The job environment is read-only properties over environment variables (read
here and nowhere else); requeue runs one command and reports its exit status
and output, so a failed requeue becomes an event instead of a lost stderr line.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequeueResult:
    """Outcome of one requeue command."""

    ok: bool
    command: str
    returncode: int | None
    output: str


class Scheduler:
    """No scheduler: nothing to requeue; the attempt comes from ``CKPTDASH_ATTEMPT`` if set."""

    name = "local"

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.env = dict(os.environ if environ is None else environ)

    @property
    def job_id(self) -> str | None:
        return self.env.get("CKPTDASH_JOB_ID")

    @property
    def attempt(self) -> int | None:
        """The attempt number the scheduler knows, or None to count attempts in the run dir."""
        value = self.env.get("CKPTDASH_ATTEMPT")
        return int(value) if value and value.isdigit() else None

    def time_left_s(self) -> float | None:
        """Seconds until the job's time limit, or None when there is none."""
        return None

    @property
    def can_requeue(self) -> bool:
        return False

    def requeue(self) -> RequeueResult:
        return RequeueResult(False, "", None, "no scheduler to requeue with (local run)")


class SlurmScheduler(Scheduler):
    """SLURM: ``scontrol requeue`` of this job (array tasks requeue only themselves)."""

    name = "slurm"

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        super().__init__(environ)
        self._end_time: float | None = None
        self._end_time_read = False

    @property
    def job_id(self) -> str | None:
        # An array task's own id is SLURM_JOB_ID; "ARRAY_TASK" names the same task and is
        # what users see in squeue. Requeueing SLURM_ARRAY_JOB_ID alone would requeue the array.
        array, task = self.env.get("SLURM_ARRAY_JOB_ID"), self.env.get("SLURM_ARRAY_TASK_ID")
        if array and task:
            return f"{array}_{task}"
        return self.env.get("SLURM_JOB_ID")

    @property
    def attempt(self) -> int | None:
        value = self.env.get("SLURM_RESTART_COUNT", "0")
        return int(value) if value.isdigit() else 0

    @property
    def can_requeue(self) -> bool:
        return self.job_id is not None

    def time_left_s(self) -> float | None:
        if not self._end_time_read:
            self._end_time_read = True
            self._end_time = self._query_end_time()
        return None if self._end_time is None else max(0.0, self._end_time - time.time())

    def _query_end_time(self) -> float | None:
        job = self.env.get("SLURM_JOB_ID")
        if not job:
            return None
        try:
            out = subprocess.run(
                ["squeue", "-h", "-j", job, "-o", "%L"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return None
        left = parse_slurm_duration(out)
        return None if left is None else time.time() + left

    def requeue(self) -> RequeueResult:
        job = self.job_id
        if job is None:
            return RequeueResult(False, "", None, "SLURM_JOB_ID is not set; not inside a job")
        return run_command(["scontrol", "requeue", job])


class CommandScheduler(Scheduler):
    """Any other scheduler: a user-supplied requeue command template.

    ``{job_id}`` in the template is replaced by ``CKPTDASH_JOB_ID`` (or the
    variable named by ``job_id_env``), e.g. ``"brequeue {job_id}"``.
    """

    name = "command"

    def __init__(
        self,
        template: str,
        job_id_env: str = "CKPTDASH_JOB_ID",
        environ: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(environ)
        self.template = template
        self.job_id_env = job_id_env

    @property
    def job_id(self) -> str | None:
        return self.env.get(self.job_id_env)

    @property
    def can_requeue(self) -> bool:
        return True

    def requeue(self) -> RequeueResult:
        argv = [part.replace("{job_id}", self.job_id or "") for part in shlex.split(self.template)]
        return run_command(argv)


def detect(
    environ: Mapping[str, str] | None = None, requeue_command: str | None = None
) -> Scheduler:
    """The scheduler this process runs under: a command template if given, SLURM, or local."""
    env = os.environ if environ is None else environ
    if requeue_command:
        return CommandScheduler(requeue_command, environ=env)
    # Interactive allocations (salloc/srun bash) have a job id but nothing to requeue into.
    if env.get("SLURM_JOB_ID") and env.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        return SlurmScheduler(env)
    return Scheduler(env)


# A requeue makes SLURM send SIGTERM to every process of the job, this command included,
# which may still be finishing (the requeue done, its reply on the way): killed, it would turn
# a successful requeue into a reported failure (measured: `scontrol requeue` exit -15). So it
# runs with SIGTERM ignored, which exec keeps; SLURM's SIGKILL after KillWait still ends it.
_IGNORE_SIGTERM = ["/bin/sh", "-c", 'trap "" TERM; exec "$@"', "sh"]


def run_command(argv: list[str], timeout_s: float = 60.0) -> RequeueResult:
    """Run a requeue command (SIGTERM ignored); never raises, the result says what happened."""
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


def parse_slurm_duration(text: str) -> float | None:
    """``[D-]HH:MM:SS`` / ``MM:SS`` as printed by squeue ``%L`` -> seconds; None if not a time."""
    text = text.strip()
    if not text or text in ("UNLIMITED", "NOT_SET", "INVALID"):
        return None
    days = 0
    if "-" in text:
        head, text = text.split("-", 1)
        if not head.isdigit():
            return None
        days = int(head)
    parts = text.split(":")
    if not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3:
        return None
    seconds = 0
    for p in parts:
        seconds = seconds * 60 + int(p)
    return float(days * 86400 + seconds)
