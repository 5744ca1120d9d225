"""Configuration of the training side, as one dataclass that checks itself."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ckptdash.errors import ConfigError as ConfigError  # also importable from here
from ckptdash.train.ending.signals import signal_number

SignalAction = Literal["requeue", "terminate", "ignore"]
RequeueMode = Literal["auto", "off"]


def _default_signals() -> dict[str, SignalAction]:
    # USR2 by default for requeue: NCCL can use USR1 for its own purposes.
    return {"SIGUSR2": "requeue", "SIGTERM": "terminate"}


@dataclass
class TrainConfig:
    """What the training side does; every field has a default that suits SLURM."""

    run_dir: str | os.PathLike[str]
    """The run directory: events, commands and (by default) checkpoints live here."""

    signals: dict[str, SignalAction] = field(default_factory=_default_signals)
    """Signal name -> meaning. ``requeue``: save, requeue (policy permitting), exit.
    ``terminate``: save and exit (the job is about to be killed; no requeue by us —
    SLURM's own requeue or preemption restarts it). ``ignore``: record only.
    Match SLURM's ``--signal=B:USR2@90`` with ``{"SIGUSR2": "requeue"}``."""

    requeue: RequeueMode = "auto"
    """``auto``: requeue after a requeue signal unless suspended in the run directory's
    settings (read fresh at signal time). ``off``: never requeue (your own scripts resubmit)."""

    requeue_command: str | None = None
    """A requeue command template for schedulers other than SLURM, e.g. ``"brequeue {job_id}"``."""

    max_attempts: int | None = 20
    """Requeue budget: no requeue once this many attempts ran (no infinite loops). None: no cap."""

    exit_on_signal: bool = True
    """After a signal save: stop training (True) so the scheduler can restart the job, or go on."""

    checkpoint_dir: str | os.PathLike[str] | None = None
    """Where signal/manual saves go; default ``RUN_DIR/checkpoints``."""

    poll_interval_s: float = 2.0
    """How often rank 0 looks for commands in the inbox (time-throttled)."""

    agree_interval_s: float = 1.0
    """Target time between cross-rank agreements (turned into steps by the measured step time).
    In a single process, the Lightning callback's checks come at most this far apart (and at
    the end of the step in which a signal arrived)."""

    heartbeat_interval_s: float = 10.0
    """Minimum time between heartbeat events."""

    validate: Literal["checksum", "size"] = "checksum"
    """How resume candidates are checked: full checksum, or size only (for very large files)."""

    resume: bool = True
    """Apply the resume rule automatically when the user gives no checkpoint path."""

    fresh: bool | str = False
    """Start fresh once, for a changed model: the first attempt that runs with this value
    records a fresh-start boundary, and no checkpoint from before it is chosen again; later
    attempts with the same value (requeues) resume from what was saved since. Give a name
    (``fresh="model-v2"``) and a new one at the next change; ``True`` is the name ``True``.
    The same from the command line: ``ckptdash resume RUN --fresh`` (docs/resume-rule.md)."""

    stale_after_s: float = 600.0
    """Another job's attempt that never recorded its end counts as still running while its
    last event is newer than this (on the same host its process id decides instead); a job
    refuses to start on a run directory such an attempt is using. 0: only the process test."""

    on_anomaly: Literal["record", "stop", "rollback"] = "record"
    """When the watched metric goes non-finite or spikes (checked at heartbeats, rank 0):
    ``record`` an ``anomaly`` event; ``stop`` training without a save or requeue; or
    ``rollback``: pin the newest valid checkpoint before the anomaly, stop, requeue as the
    policy allows (the next attempt resumes before the divergence). See docs/goodput.md."""

    anomaly_metric: str = "loss"
    """The heartbeat metric watched for anomalies (Lightning: a name given to ``self.log``)."""

    anomaly_factor: float = 5.0
    """A value above this many times the median of the recent values is a spike."""

    anomaly_window: int = 20
    """How many recent healthy values (one per heartbeat) the median is taken over."""
    pulse_interval_s: float = 1.0
    """How often every rank writes a ``pulse`` event (its step; no fsync) from a background
    thread, never from the step itself: the dashboard's 1 Hz progress and each rank's sign of
    life. About 130 bytes a second per rank. 0: no pulses (and no watchdog)."""

    hung_after_s: float = 300.0
    """The in-job watchdog: once training has reached its first step, a rank whose main thread
    has not reached another step boundary for this long records an ``alert_raised`` (hung),
    and ``alert_cleared`` when it moves again. Raise it above your longest validation or save;
    0: off."""

    async_save: bool = False
    """Lightning: save every checkpoint in the background (stage a copy in memory, persist
    on a thread); see docs/async.md. ``Monitor.save_async`` needs no switch."""

    async_in_flight: int = 1
    """How many background saves may be in flight at once; each holds a copy of the state
    in memory, and a save that finds them all busy waits for the oldest."""

    direct_io: bool = True
    """Background persists write around the page cache (``O_DIRECT``) where the filesystem
    allows it: the same file for a tenth of the CPU, which training keeps (docs/async.md).
    False: buffered writes, for a filesystem where direct writes are slow (some NFS
    servers commit each one). Synchronous saves always write buffered."""

    continue_loggers: bool = True
    """Every attempt logs into the same run of each experiment logger (TensorBoard, W&B,
    MLflow, CSV), its redone steps replaced or dropped (docs/loggers.md). Lightning: the
    Trainer's loggers are set up for it; elsewhere through ``Monitor.loggers``. False: leave
    the loggers alone."""

    @classmethod
    def given(
        cls,
        run_dir: str | os.PathLike[str] | None,
        config: TrainConfig | None,
        options: dict[str, Any],
        *,
        who: str,
    ) -> TrainConfig:
        """The configuration of a ``Monitor`` or callback built as ``X(run_dir, **options)``
        or ``X(config=...)``: one way to read those arguments for every entry point."""
        if config is not None:
            return config
        if run_dir is None:
            raise TypeError(f"{who} needs a run_dir (or a TrainConfig as config=)")
        return cls(run_dir=run_dir, **options)

    def __post_init__(self) -> None:
        for name, action in self.signals.items():
            try:
                signal_number(name)
            except ValueError as exc:
                raise ConfigError(f"TrainConfig.signals: {exc}") from None
            if action not in ("requeue", "terminate", "ignore"):
                raise ConfigError(
                    f"TrainConfig.signals[{name!r}] = {action!r}: use 'requeue', 'terminate' or"
                    " 'ignore'"
                )
        if self.requeue not in ("auto", "off"):
            raise ConfigError(f"TrainConfig.requeue = {self.requeue!r}: use 'auto' or 'off'")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ConfigError(
                f"TrainConfig.max_attempts = {self.max_attempts}: use a number >= 1, or None"
            )
        if self.async_in_flight < 1:
            raise ConfigError(f"TrainConfig.async_in_flight = {self.async_in_flight}: use >= 1")
        for name in ("poll_interval_s", "agree_interval_s", "heartbeat_interval_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"TrainConfig.{name} = {getattr(self, name)}: must be > 0")
        for name in ("pulse_interval_s", "hung_after_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"TrainConfig.{name} = {getattr(self, name)}: must be >= 0")
        if self.stale_after_s < 0:
            raise ConfigError(f"TrainConfig.stale_after_s = {self.stale_after_s}: must be >= 0")
        if self.on_anomaly not in ("record", "stop", "rollback"):
            raise ConfigError(
                f"TrainConfig.on_anomaly = {self.on_anomaly!r}: use 'record', 'stop' or 'rollback'"
            )
        if not self.anomaly_factor > 1:
            raise ConfigError(
                f"TrainConfig.anomaly_factor = {self.anomaly_factor}: must be > 1 (e.g. 5: five"
                " times the recent median)"
            )
        if self.anomaly_window < 3:
            raise ConfigError(f"TrainConfig.anomaly_window = {self.anomaly_window}: must be >= 3")
        if not isinstance(self.fresh, bool | str) or self.fresh == "":
            raise ConfigError(
                f"TrainConfig.fresh = {self.fresh!r}: use False, True or a name for this start"
                ' (e.g. fresh="model-v2")'
            )
        if self.validate not in ("checksum", "size"):
            raise ConfigError(f"TrainConfig.validate = {self.validate!r}: use 'checksum' or 'size'")

    @property
    def fresh_label(self) -> str:
        """What ``run_started`` records as the reason of a fresh start this option asks for."""
        return "" if self.fresh is False else f"fresh={self.fresh!r} given to ckptdash"

    @property
    def checkpoint_path(self) -> Path:
        return (
            Path(self.checkpoint_dir) if self.checkpoint_dir else Path(self.run_dir) / "checkpoints"
        )
