"""The Trainer's loggers continue one run across attempts (:mod:`ckptdash.train.tracking.loggers`).

Lightning opens every logger's experiment (``wandb.init``, an MLflow run, TensorBoard's
version folder) in ``_call_setup_hook``, *before* any callback's ``setup``, and resolves a
TensorBoard version earlier still (``trainer.log_dir`` for the profiler). So
:func:`install_fit_hook` wraps the Trainer's run once (:func:`compat.wrap_run`): when a
Trainer with a ``CkptDashCallback`` starts fitting, :meth:`TrainerLoggers.configure` names
each logger's version / run id first. Once the checkpoint is restored (``on_train_start``:
the resume step is ``trainer.global_step``) :meth:`TrainerLoggers.attach` replaces or drops
what earlier attempts logged after it and records each logger run as a ``logger_attached``
event.

Only rank 0 talks to the loggers (Lightning gives other ranks a dummy experiment).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ckptdash.events import LoggerAttached
from ckptdash.lightning import compat
from ckptdash.rundir import RunDir, door
from ckptdash.train.engine.session import Session
from ckptdash.train.tracking import loggers

KEPT_SUFFIX: Final = ".ckptdash-kept"
"""Lightning's CSV writer deletes ``metrics.csv`` of a folder it reopens: ckptdash moves it
aside under this suffix first and writes the kept rows back at ``on_train_start``."""

_KINDS: Final = (
    ("TensorBoardLogger", "tensorboard"),
    ("CSVLogger", "csv"),
    ("WandbLogger", "wandb"),
    ("MLFlowLogger", "mlflow"),
)


def _kind(logger: Any) -> str | None:
    # By class name along the MRO: the logger packages need not be importable, and a
    # subclass of Lightning's logger is still that logger.
    names = {cls.__name__ for cls in type(logger).__mro__}
    return next((kind for cls_name, kind in _KINDS if cls_name in names), None)


@dataclass
class _Slot:
    name: str  # tensorboard, csv#2, ...
    kind: str
    logger: Any
    named: bool  # the user chose its version / id


class TrainerLoggers:
    """What ckptdash did to one Trainer's loggers in one attempt."""

    def __init__(self, trainer: Any, run: RunDir) -> None:
        self.trainer = trainer
        self.run = run
        self.rank = int(getattr(trainer, "global_rank", 0) or 0)
        self.slots: list[_Slot] = []

    # --- before Lightning opens the experiments ------------------------------------------

    def configure(self) -> None:
        """Name each logger's version / run id after the run (unless the user named it)."""
        derived = loggers.derived_id(self.run.ensure().run_id)
        recorded = loggers.recorded_loggers(self.run) if self.rank == 0 else {}
        seen: dict[str, int] = {}
        for logger in getattr(self.trainer, "loggers", []):
            kind = _kind(logger)
            if kind is None:
                continue
            seen[kind] = seen.get(kind, 0) + 1
            name = kind if seen[kind] == 1 else f"{kind}#{seen[kind]}"
            previous = recorded.get(name)
            named = _CONFIGURE[kind](logger, derived, previous)
            self.slots.append(_Slot(name, kind, logger, named))
            if named and previous is not None and self.rank == 0:
                given = _id_of(kind, logger)
                if given is not None and previous.id and given != previous.id:
                    print(loggers.clash_line(name, given, previous.id), file=sys.stderr)
        if self.rank == 0 and any(s.kind == "wandb" and not s.named for s in self.slots):
            # Before Lightning's wandb.init: not in a service that holds the id open for an
            # earlier attempt that was killed (this attempt's session has not begun yet).
            loggers.own_wandb_service(again=bool(self.run.event_files()))

    # --- once the checkpoint is restored -------------------------------------------------

    def attach(self, session: Session, resume_step: int) -> None:
        """Replace or drop what earlier attempts logged from ``resume_step`` on; record each
        logger run (rank 0). Lightning logs a batch's values under the ``global_step`` it
        started at, so the resumed attempt's first batch logs ``resume_step`` again."""
        if self.rank != 0 or session.rank != 0:
            return
        again = session.attempt > 0  # an earlier attempt may have logged past this point
        earlier = session.earlier_step
        for slot in self.slots:
            redone = ""
            if again:
                redone = _REDO[slot.kind](slot.logger, resume_step, earlier)
            session.writer.emit(
                LoggerAttached,
                step=resume_step,
                logger=slot.name,
                id=_id_of(slot.kind, slot.logger) or "",
                location=_location_of(slot.kind, slot.logger),
                redone=redone,
                named=slot.named,
            )


# --- per logger: name it ------------------------------------------------------------------------


def _configure_versioned(logger: Any, derived: str, previous: LoggerAttached | None) -> bool:
    """TensorBoard and CSV: the version folder ``<name>/ckptdash-<run id>``."""
    if compat.experiment_opened(logger):
        return True
    if compat.logger_version(logger) is not None and not _lightning_default(logger):
        return True
    compat.set_logger_version(logger, derived)
    return False


def _lightning_default(logger: Any) -> bool:
    """``Trainer(logger=True)`` (the default) makes a TensorBoardLogger versioned by the SLURM
    job id: a new folder per resubmitted job, and not a version the user chose."""
    job_id = os.environ.get("SLURM_JOB_ID", "")
    return (
        job_id.isdigit()
        and compat.logger_version(logger) == int(job_id)
        and compat.logger_name(logger) == "lightning_logs"
    )


def _configure_csv(logger: Any, derived: str, previous: LoggerAttached | None) -> bool:
    named = _configure_versioned(logger, derived, previous)
    if not compat.experiment_opened(logger) and rank_zero():
        _keep_csv(Path(logger.log_dir) / "metrics.csv")
    return named


def _configure_wandb(logger: Any, derived: str, previous: LoggerAttached | None) -> bool:
    """W&B: run id ``ckptdash-<run id>``, resumed (``resume="allow"``, Lightning's default)."""
    if (
        compat.wandb_id(logger) is not None
        or compat.experiment_opened(logger)
        or os.environ.get("WANDB_RUN_ID")
    ):
        return True
    compat.set_wandb_id(logger, derived)
    return False


def _configure_mlflow(logger: Any, derived: str, previous: LoggerAttached | None) -> bool:
    """MLflow: its store makes run ids, so the first attempt's is recorded and reused."""
    if compat.mlflow_run_id(logger) is not None or compat.mlflow_initialized(logger):
        return True
    if compat.mlflow_run_name(logger) is None:
        compat.set_mlflow_run_name(logger, derived)
    if previous is not None and previous.id and rank_zero():
        if previous.location and previous.location != _mlflow_uri(logger):
            return False  # another tracking store now: start a run there
        try:
            compat.mlflow_client(logger).get_run(previous.id)
        except Exception as exc:  # deleted, or a store that cannot be reached
            print(
                f"ckptdash: MLflow run {previous.id} of earlier attempts cannot be opened"
                f" ({type(exc).__name__}: {exc}); logging into a new run",
                file=sys.stderr,
            )
            return False
        compat.set_mlflow_run_id(logger, previous.id)
    return False


_CONFIGURE: Final[dict[str, Callable[[Any, str, LoggerAttached | None], bool]]] = {
    "tensorboard": _configure_versioned,
    "csv": _configure_csv,
    "wandb": _configure_wandb,
    "mlflow": _configure_mlflow,
}


def rank_zero() -> bool:
    from lightning_utilities.core.rank_zero import rank_zero_only

    return int(getattr(rank_zero_only, "rank", 0) or 0) == 0


# --- per logger: the steps after the resume point -------------------------------------------------


def _purge_tensorboard(logger: Any, resume_step: int, earlier: int | None) -> str:
    """A ``SessionLog(START)`` at the purge step: TensorBoard drops every older value from
    that step on (what ``SummaryWriter(purge_step=)`` writes, for a writer already open)."""
    writer = logger.experiment
    if type(writer).__module__.startswith("tensorboardX"):
        from tensorboardX.proto.event_pb2 import Event, SessionLog
    else:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
    compat.tensorboard_file_writer(writer).add_event(
        Event(step=resume_step, session_log=SessionLog(status=SessionLog.START))
    )
    writer.flush()
    return loggers.REPLACED


def _rewrite_csv(logger: Any, resume_step: int, earlier: int | None) -> str:
    """``metrics.csv`` without the rows from the resume step on (atomically), and Lightning's
    writer told the header, so that it appends under it."""
    target = Path(logger.log_dir) / "metrics.csv"
    kept = target.with_name(target.name + KEPT_SUFFIX)
    try:
        header = loggers.truncate_csv(kept, resume_step, target=target)
    except OSError as exc:  # a link, a FIFO, another account's file: never read
        print(f"ckptdash: {kept}: not read back ({exc.strerror})", file=sys.stderr)
        return ""
    if header is None:
        return ""
    kept.unlink()
    experiment = logger.experiment
    if header and not experiment.metrics_keys:
        experiment.metrics_keys = sorted(header)
    return loggers.REPLACED


def _drop_logged(logger: Any, resume_step: int, earlier: int | None) -> str:
    """W&B and MLflow append: the steps an earlier attempt logged are not logged again (their
    earlier values stay). One seen at ``global_step`` g has logged the batches before it, up
    to step g - 1 (after a SIGKILL it may have gone on for up to a pulse interval unseen)."""
    if earlier is None or earlier - 1 < resume_step:
        return ""
    loggers.DropUntil(logger, earlier - 1)
    return loggers.DROPPED


_REDO: Final[dict[str, Callable[[Any, int, int | None], str]]] = {
    "tensorboard": _purge_tensorboard,
    "csv": _rewrite_csv,
    "wandb": _drop_logged,
    "mlflow": _drop_logged,
}


def _keep_csv(metrics: Path) -> None:
    """Move ``metrics.csv`` aside before Lightning's writer deletes it (a kept file from an
    attempt that died before writing it back is the older truth: it stays).

    The version folder is made or tightened first (the owner's alone: :func:`door.own_folder`)
    and every name is used relative to it; a kept name that is not the owner's own regular
    file (a link to ``~/.ssh/key``, a FIFO, a hard link) is removed, never read."""
    try:
        held = door.own_folder(metrics.parent)
    except OSError as exc:  # another account's folder: no continuity, Lightning goes on
        print(f"ckptdash: {exc}", file=sys.stderr)
        return
    kept = metrics.name + KEPT_SUFFIX
    try:
        if door.is_own_file(held, kept):
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(kept, dir_fd=held)  # not ours (a link is removed, its target untouched)
            print(f"ckptdash: {metrics.parent / kept}: not the run's own; removed", file=sys.stderr)
        with contextlib.suppress(FileNotFoundError):
            os.rename(metrics.name, kept, src_dir_fd=held, dst_dir_fd=held)
    finally:
        os.close(held)


# --- what to show ---------------------------------------------------------------------------------


def _id_of(kind: str, logger: Any) -> str | None:
    if kind in ("tensorboard", "csv"):
        version = compat.logger_version(logger)
        if version is None:
            return None
        return version if isinstance(version, str) else f"version_{version}"
    if kind == "wandb":
        experiment = compat.opened_experiment(logger)
        run_id = (
            getattr(experiment, "id", None) if experiment is not None else compat.wandb_id(logger)
        )
        return run_id if isinstance(run_id, str) else None
    run_id = compat.mlflow_run_id(logger)
    return run_id if isinstance(run_id, str) else None


def _location_of(kind: str, logger: Any) -> str:
    if kind in ("tensorboard", "csv"):
        return os.path.abspath(str(logger.log_dir))
    if kind == "wandb":
        experiment = compat.opened_experiment(logger)
        url = getattr(experiment, "url", None)
        if url:
            return str(url)
        folder = getattr(experiment, "dir", None)
        return os.path.dirname(os.path.abspath(folder)) if folder else compat.wandb_project(logger)
    return _mlflow_uri(logger)


def _mlflow_uri(logger: Any) -> str:
    return compat.mlflow_tracking_uri(logger)


# --- the hook ------------------------------------------------------------------------------------


def install_fit_hook(before_fit: Callable[[Any], None]) -> None:
    """Wrap the Trainer's run (once per process: :func:`compat.wrap_run`) so
    ``before_fit(trainer)`` runs when a fit starts, before Lightning resolves any logger's
    version or opens its experiment."""

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(self.state, "fn", None) == "fit":
                before_fit(self)
            return original(self, *args, **kwargs)

        return run

    compat.wrap_run(wrap)
