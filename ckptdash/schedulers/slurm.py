"""SLURM inside a job: detection, job id, restart count, time left, ``scontrol requeue``.

SLURM's side seen from a login node (the job's state, hold/release/cancel, its Requeue flag)
is :mod:`ckptdash.schedulers.slurm_queue`; the two are split so that a training process loads
only this one.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping

from ckptdash.schedulers.base import RequeueResult, Scheduler, run_command


def detected(env: Mapping[str, str]) -> bool:
    """Inside a SLURM batch job. Interactive allocations (salloc/srun bash) have a job id but
    nothing to requeue into."""
    return bool(env.get("SLURM_JOB_ID")) and env.get("SLURM_JOB_NAME") not in (
        "bash",
        "interactive",
    )


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
