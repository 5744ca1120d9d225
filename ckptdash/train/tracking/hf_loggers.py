"""The Hugging Face Trainer's ``report_to`` loggers continue one run across attempts.

The Trainer's reporting callbacks read their run from the environment, at different times:
TensorBoard's folder (``TENSORBOARD_LOGGING_DIR``) when the Trainer is built, the W&B run
(``WANDB_RUN_ID``, ``WANDB_RESUME``, read by ``wandb.init``) and the MLflow run
(``MLFLOW_RUN_ID``) when training begins. So :func:`name_runs` sets them (unless the user
did) when ckptdash's callback is built, :func:`purge_tensorboard` marks the redone steps
for TensorBoard before the Trainer opens its writer, and :func:`record_runs` records
which runs this attempt logs into once they are open (see docs/loggers.md).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ckptdash.resume import choose_resume
from ckptdash.rundir import RunDir
from ckptdash.train.engine import dist
from ckptdash.train.monitor import Monitor
from ckptdash.train.tracking import loggers

_TENSORBOARD_DIR = "TENSORBOARD_LOGGING_DIR"
_SET_BY_US: dict[str, str] = {}
"""What ckptdash put in the environment: a later run in the same process replaces it, a
value the user set stays."""


def name_runs(run: RunDir) -> None:
    """Set the environment the reporting callbacks read, where the user has not (every rank;
    only the main process reports)."""
    derived = loggers.derived_id(run.ensure().run_id)
    _set(_TENSORBOARD_DIR, str(Path(run.root).absolute() / "tensorboard" / derived))
    _set("WANDB_RUN_ID", derived)
    _set("WANDB_RESUME", "allow")
    if os.environ.get("WANDB_RUN_ID") == derived and dist.rank() == 0:
        # ckptdash's id (see own_wandb_service), in the process that reports: the Trainer's
        # W&B run is rank 0's, and the other ranks, which open none, say nothing of it.
        loggers.own_wandb_service(again=bool(run.event_files()))
    mlflow = loggers.recorded_loggers(run).get("mlflow")
    _set("MLFLOW_RUN_ID", mlflow.id if mlflow is not None and mlflow.id else None)


def forget_runs() -> None:
    """When training ends: take back what :func:`name_runs` put in the environment (a value
    the user set since stays), so that no process this one starts later — another run's
    job, a notebook's next launch — inherits this run's W&B or MLflow id."""
    for name, value in list(_SET_BY_US.items()):
        if os.environ.get(name) == value:
            del os.environ[name]
        del _SET_BY_US[name]


def _set(name: str, value: str | None) -> None:
    current = os.environ.get(name)
    if current is not None and current != _SET_BY_US.get(name):
        return  # the user's
    if value is None:
        os.environ.pop(name, None)
        _SET_BY_US.pop(name, None)
    else:
        os.environ[name] = _SET_BY_US[name] = value


def purge_tensorboard(run: RunDir, args: Any) -> None:
    """Before the Trainer's TensorBoard writer opens: when its folder holds earlier attempts'
    events, a first event file that tells TensorBoard to drop their values from the step after
    the resume rule's choice (what ``trainer.train(resume_from_checkpoint=
    ckptdash.resume_path(run))`` resumes from) on. The Trainer logs a step after it ran and
    saves after logging: ``checkpoint-N`` holds the logs up to step N."""
    folder = os.environ.get(_TENSORBOARD_DIR)
    if not folder or "tensorboard" not in (getattr(args, "report_to", None) or []):
        return
    try:
        earlier = any(p.name.startswith("events.out.tfevents.") for p in Path(folder).iterdir())
    except FileNotFoundError:
        return
    if not earlier:
        return
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # the Trainer then uses tensorboardX, whose writer takes it too
        from tensorboardX import SummaryWriter  # type: ignore[no-redef]
    step = choose_resume(run).step
    SummaryWriter(log_dir=folder, purge_step=loggers.purge_step(step)).close()


def record_runs(monitor: Monitor, args: Any, resume_step: int) -> list[loggers.DropUntil]:
    """Record the TensorBoard folder, W&B run and MLflow run this attempt reports to; for W&B
    and MLflow, which only append, drop the steps an earlier attempt logged past the resume
    point (:func:`drop_logged`). Returns the droppers (``restore`` them when training ends)."""
    report_to = getattr(args, "report_to", None) or []
    runs = monitor.loggers
    again = monitor.attempt > 0
    through = _logged_through(monitor, resume_step)
    dropped = loggers.DROPPED if through is not None else ""
    drops: list[loggers.DropUntil] = []
    folder = os.environ.get(_TENSORBOARD_DIR)
    if "tensorboard" in report_to and folder:
        named = not Path(folder).name.startswith(loggers.ID_PREFIX)
        redone = loggers.REPLACED if again else ""
        runs.attach("tensorboard", Path(folder).name, folder, redone=redone, named=named)
    wandb = sys.modules.get("wandb")
    run = getattr(wandb, "run", None) if wandb is not None else None
    if "wandb" in report_to and run is not None:
        run_id = str(run.id)
        location = str(getattr(run, "url", "") or "") or _wandb_folder(run)
        runs.attach("wandb", run_id, location, redone=dropped, named=run_id != runs.run_id)
        if through is not None:  # the WandbCallback logs through the module's wandb.log
            drops.append(loggers.DropUntil(wandb, through, "log", _wandb_step))
    mlflow = sys.modules.get("mlflow")
    active = mlflow.active_run() if mlflow is not None else None
    if "mlflow" in report_to and mlflow is not None and active is not None:
        recorded = runs.recorded("mlflow")
        if recorded is not None and recorded != active.info.run_id:
            print(loggers.clash_line("mlflow", active.info.run_id, recorded), file=sys.stderr)
        uri = str(mlflow.get_tracking_uri())
        runs.attach("mlflow", active.info.run_id, uri, redone=dropped)
        if through is not None:  # the MLflowCallback calls mlflow.log_metrics(..., step=)
            drops.append(loggers.DropUntil(mlflow, through, "log_metrics"))
    return drops


def _logged_through(monitor: Monitor, resume_step: int) -> int | None:
    """The last step an earlier attempt logged past ``resume_step``, or None. The Trainer
    logs step N after ckptdash saw it at ``on_step_end``: one seen at N logged through N - 1
    (after a SIGKILL, up to a pulse interval of steps more may have gone unseen)."""
    earlier = monitor.session.earlier_step
    if monitor.attempt == 0 or earlier is None or earlier - 1 <= resume_step:
        return None
    return earlier - 1


def _wandb_step(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """The Trainer's step in ``wandb.log({..., "train/global_step": N})``."""
    data = args[0] if args else kwargs.get("data")
    return data.get("train/global_step") if isinstance(data, dict) else None


def _wandb_folder(run: Any) -> str:
    folder = getattr(run, "dir", None)
    return os.path.dirname(os.path.abspath(folder)) if folder else ""
