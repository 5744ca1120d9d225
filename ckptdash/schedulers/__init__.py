"""Schedulers: one module per scheduler, each knowing everything about it.

A scheduler is two modules: the job side (``slurm.py``, ``gridengine.py``: detection, job id,
attempt, what each signal means, time left, requeue and how to tell it worked, whether a
signal means a cancel) that training processes load, and the login-node side
(``slurm_queue.py``, ``gridengine_queue.py``: the job's state, hold / release / cancel of a
pending job, the job's own requeue switch) that the CLI, the dashboard and ``ckptdash watch``
load. ``command.py`` is any other scheduler by a requeue command template, ``local.py`` none.
The interface both sides implement is :mod:`ckptdash.schedulers.base`; adding PBS, LSF or
Flux is one module per side plus a line in :func:`detect` and :func:`queue_for`
(docs/architecture.md).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from typing import Protocol

from ckptdash.schedulers import gridengine, slurm
from ckptdash.schedulers.base import (
    JobStatus,
    JobView,
    Queue,
    RequeueResult,
    Runner,
    Scheduler,
    run_command,
)
from ckptdash.schedulers.command import CommandScheduler
from ckptdash.schedulers.gridengine import GridEngineScheduler
from ckptdash.schedulers.local import LocalScheduler
from ckptdash.schedulers.slurm import SlurmScheduler

__all__ = [
    "CommandScheduler",
    "GridEngineScheduler",
    "JobStatus",
    "JobView",
    "LocalScheduler",
    "Queue",
    "RequeueResult",
    "Runner",
    "Scheduler",
    "SlurmScheduler",
    "detect",
    "job_of",
    "queue_for",
    "queue_here",
    "run_command",
]

QUEUES = ("slurm", "gridengine")
"""The schedulers with a login-node side (:func:`queue_for`)."""


def detect(
    environ: Mapping[str, str] | None = None, requeue_command: str | None = None
) -> Scheduler:
    """The scheduler this process runs under: a command template if given, SLURM, Grid
    Engine, or none (local)."""
    env = os.environ if environ is None else environ
    if requeue_command:
        return CommandScheduler(requeue_command, environ=env)
    if slurm.detected(env):
        return SlurmScheduler(env)
    if gridengine.detected(env):
        return GridEngineScheduler(env)
    return LocalScheduler(env)


def queue_for(name: str, runner: Runner | None = None) -> Queue | None:
    """The login-node side of scheduler ``name`` (as attempts record it); None for one ckptdash
    cannot ask (``local``, ``command``)."""
    if name == "slurm":
        from ckptdash.schedulers.slurm_queue import SlurmQueue

        return SlurmQueue(runner)
    if name == "gridengine":
        from ckptdash.schedulers.gridengine_queue import GridEngineQueue

        return GridEngineQueue(runner)
    return None


def queue_here() -> str:
    """The scheduler whose client commands are on this machine, for a job named by hand
    (``--job``) on a run that recorded none: SLURM's ``scontrol``, else Grid Engine's
    ``qstat`` with ``SGE_ROOT`` set, else SLURM (whose error then says what is missing)."""
    if shutil.which("scontrol"):
        return "slurm"
    if shutil.which("qstat") and os.environ.get("SGE_ROOT"):
        return "gridengine"
    return "slurm"


class Attempt(Protocol):
    """What :func:`job_of` reads of an attempt (:class:`ckptdash.state.AttemptInfo`)."""

    @property
    def attempt(self) -> int: ...
    @property
    def scheduler(self) -> str: ...
    @property
    def job_id(self) -> str | None: ...


def job_of(attempts: Iterable[Attempt]) -> tuple[str, str] | None:
    """(scheduler, job id) of the newest attempt that recorded a job of a scheduler ckptdash
    can ask (:data:`QUEUES`); None when there is none."""
    for a in sorted(attempts, key=lambda a: a.attempt, reverse=True):
        if a.scheduler in QUEUES and a.job_id:
            return a.scheduler, a.job_id
    return None
