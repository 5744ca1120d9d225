"""``Monitor.loggers``: one logger run per ckptdash run, for loops that open their loggers.

A plain PyTorch loop, an Accelerate script or any code that builds its own
``SummaryWriter`` / ``wandb.init`` / ``mlflow.start_run`` asks here for the arguments that
make every attempt continue the same logger run, and each call records which run that is
(a ``logger_attached`` event, shown by ``ckptdash status`` and the dashboard)::

    writer = SummaryWriter(**monitor.loggers.tensorboard_writer_kwargs("runs/tb"))
    wandb.init(project="exp", **monitor.loggers.wandb_init_kwargs())
    mlflow.start_run(run_id=monitor.loggers.mlflow_run_id)
    monitor.loggers.attach("mlflow", mlflow.active_run().info.run_id, mlflow.get_tracking_uri())

Call them after ``monitor.load()`` (the resume step is then known). Only rank 0 records.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ckptdash.events import LoggerAttached
from ckptdash.train.engine.session import Session
from ckptdash.train.tracking import loggers


class LoggerRuns:
    """Ids, resume step and logger arguments of one attempt (see the module docstring)."""

    def __init__(self, session: Session, resume_step: Callable[[], int | None]) -> None:
        self._session = session
        self._resume_step = resume_step
        self._recorded: dict[str, LoggerAttached] | None = None

    @property
    def run_id(self) -> str:
        """The version / run id every attempt of this run logs under: ``ckptdash-<run id>``."""
        return loggers.derived_id(self._session.run.info().run_id)

    @property
    def resume_step(self) -> int | None:
        """The step of the checkpoint this attempt resumed from (None: a fresh start)."""
        return self._resume_step()

    @property
    def purge_step(self) -> int:
        """The first step this attempt logs again: earlier values from it on are stale."""
        return loggers.purge_step(self.resume_step)

    @property
    def logged_through(self) -> int | None:
        """The highest step an earlier attempt was seen at, when it is past the resume step:
        an append-only logger (W&B, MLflow) already holds steps up to it; skip logging them
        again (``if step > (monitor.loggers.logged_through or -1): run.log(...)``)."""
        earlier, resumed = self._session.earlier_step, self.resume_step
        if earlier is None or (resumed is not None and earlier <= resumed):
            return None
        return earlier

    def recorded(self, logger: str) -> str | None:
        """The id an earlier attempt recorded for ``logger`` (e.g. an MLflow run id), or None."""
        if self._recorded is None:
            self._recorded = loggers.recorded_loggers(self._session.run)
        found = self._recorded.get(logger)
        return found.id if found is not None and found.id else None

    @property
    def mlflow_run_id(self) -> str | None:
        """The MLflow run earlier attempts logged into (``mlflow.start_run(run_id=...)``): None
        in the first attempt, which then records its new run with :meth:`attach`."""
        return self.recorded("mlflow")

    def tensorboard_writer_kwargs(self, root: str | os.PathLike[str] = "runs") -> dict[str, Any]:
        """``SummaryWriter(**kwargs)``: one folder under ``root`` for every attempt, and
        ``purge_step`` so TensorBoard replaces the steps this attempt runs again."""
        log_dir = os.path.join(os.fspath(root), self.run_id)
        redone = loggers.REPLACED if self._session.attempt > 0 else ""
        self.attach("tensorboard", self.run_id, os.path.abspath(log_dir), redone=redone)
        return {"log_dir": log_dir, "purge_step": self.purge_step}

    def wandb_init_kwargs(self) -> dict[str, Any]:
        """``wandb.init(**kwargs)``: the same W&B run id in every attempt, resumed (and, after
        the first attempt, not in a W&B service another process started: see
        :func:`ckptdash.train.tracking.loggers.own_wandb_service`)."""
        if self._session.rank == 0:
            loggers.own_wandb_service(again=self._session.attempt > 0)
        self.attach("wandb", self.run_id, redone=loggers.DROPPED if self.logged_through else "")
        return {"id": self.run_id, "resume": "allow"}

    def attach(
        self, logger: str, run_id: str, location: str = "", *, redone: str = "", named: bool = False
    ) -> None:
        """Record that this attempt logs into ``logger``'s run ``run_id`` (rank 0)."""
        session = self._session
        if session.rank != 0:
            return
        session.writer.emit(
            LoggerAttached,
            step=self.resume_step,
            logger=logger,
            id=run_id,
            location=location,
            redone=redone,
            named=named,
        )
