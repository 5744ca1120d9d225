"""The records :class:`~ckptdash.state.RunState` hands out: plain data that the views, the
resume rule, the run guard and the CLI read. Nothing here reads events; see
:mod:`ckptdash.state` for how they are built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias

from ckptdash.events import BadLine

SHOWN_STALE_AFTER_S: Final = 120.0
"""A running attempt silent for this long is *shown* as stale: the dashboard's badge (its
``--stale-after``) and ``ckptdash status``. A view only; the other thresholds on silence
act and wait longer: health's ``stale`` alert (``Thresholds.stale_after_s``), the run
guard (``TrainConfig.stale_after_s``) and goodput's accounting (``goodput.STALE_AFTER_S``)."""

AttemptOutcome: TypeAlias = Literal["running", "finished", "stopped", "failed", "lost"]
"""How an attempt ended (:attr:`AttemptInfo.outcome`)."""
CheckpointStatus: TypeAlias = Literal["saved", "saving", "failed", "removed", "invalid"]
"""Where a checkpoint path stands (:attr:`CheckpointInfo.status`)."""
CommandStatus: TypeAlias = Literal[
    "pending", "received", "applied", "rejected", "expired", "malformed"
]
"""Where a command stands (:attr:`CommandInfo.status`)."""
AlertEvent: TypeAlias = Literal["alert_raised", "alert_cleared", "action_taken"]
"""The event an :class:`AlertRecord` comes from."""


@dataclass
class AttemptInfo:
    """One attempt (one scheduler run of the job).

    ``outcome`` is ``running``; ``finished`` (run_finished with reason
    ``completed``); ``stopped`` (run_finished with another reason, e.g. for a
    requeue); ``failed`` (run_failed); or ``lost`` when a later attempt started
    although this one never said it ended (killed without warning).
    ``last_heartbeat_t`` is the time of its last event of any kind (its last sign of life).
    """

    attempt: int
    host: str = ""
    scheduler: str = ""
    job_id: str | None = None
    world_size: int | None = None
    pid: int | None = None
    max_steps: int | None = None
    requeue_budget: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    outcome: AttemptOutcome = "running"
    end_reason: str = ""
    resumed_from: str | None = None
    resume_reason: str = ""
    fresh: str = ""
    """Why this attempt started fresh (a fresh-start boundary), "" when it did not."""
    last_heartbeat_t: float | None = None
    step: int | None = None
    epoch: int | None = None
    time_left_s: float | None = None
    ranks: list[int] = field(default_factory=list)


@dataclass
class CheckpointInfo:
    """One checkpoint path and what the log says about it.

    ``status``: ``saved`` (the file at ``path`` is a valid resume candidate),
    ``saving``, ``failed``, ``removed`` or ``invalid`` (``reason`` says why).
    A save or failed save *over* a saved file leaves it ``saved``: writes are
    atomic, so the older file is intact; ``error`` then holds the later
    failure. A newer save of the same path (``last.ckpt``, nanoGPT's ``ckpt.pt``) is what
    the record describes; ``replaced`` counts the older saves it superseded and
    ``earlier`` keeps each of them (history for the table and goodput: their checksums
    describe bytes the file no longer holds, so they are never resume candidates).
    """

    path: str
    status: CheckpointStatus
    step: int | None = None
    epoch: int | None = None
    trigger: str = ""
    t: float | None = None
    started_at: float | None = None
    size_bytes: int | None = None
    duration_s: float | None = None
    blocking_s: float | None = None
    """How long the save stalled training (a synchronous save: all of ``duration_s``)."""
    monitored: dict[str, float] | None = None
    """A Lightning ModelCheckpoint's monitored metric and its value at this save."""
    checksum: str = ""
    written_at: str | None = None
    """Where the CheckpointIO handed ``path`` really wrote it (what validation checks)."""
    unvalidated: str = ""
    """Why ckptdash could not check the files (a CheckpointIO writing where it cannot see)."""
    artifact: str = ""
    """Why it cannot resume training (weights only, an export, a model alone); "" when it
    resumes training (model, optimizer and loop state)."""
    same_as: str | None = None
    """The checkpoint this path links to or copies (Lightning's ``last.ckpt``), or None."""
    attempt: int | None = None
    rank: int | None = None
    error: str = ""
    reason: str = ""
    replaced: int = 0
    earlier: tuple[SavedVersion, ...] = ()
    """Every earlier save of this path, oldest first (``replaced`` of them)."""

    @property
    def resumable(self) -> bool:
        """Whether it resumes training (model, optimizer and loop state), not an artifact."""
        return not self.artifact


@dataclass(frozen=True)
class SavedVersion:
    """One ``checkpoint_saved`` of a path that was saved again since (see
    :attr:`CheckpointInfo.earlier`): when, by whom, and what it cost."""

    t: float
    step: int | None
    attempt: int
    rank: int
    trigger: str
    size_bytes: int
    duration_s: float
    blocking_s: float
    """How long the save stalled training (a synchronous save: all of ``duration_s``)."""


@dataclass
class SignalInfo:
    """A signal that reached a rank, and what it was configured to mean."""

    t: float
    attempt: int
    rank: int
    step: int | None
    signal: str
    action: str


@dataclass
class RequeueInfo:
    """A requeue made (``issued``) or skipped, with the reason."""

    t: float
    attempt: int
    rank: int
    issued: bool
    job_id: str | None
    command: str
    reason: str


@dataclass
class ExceptionInfo:
    """An exception that escaped a training step."""

    t: float
    attempt: int
    rank: int
    step: int | None
    error_type: str
    message: str
    traceback: str


@dataclass
class CommandInfo:
    """One command and where it stands.

    ``status``: ``pending`` (in the inbox), ``received`` (claimed), then
    ``applied`` / ``rejected`` / ``expired`` from the training side's events,
    which outrank anything the file's location says. ``malformed`` means the
    file does not parse (``error`` says why) and no rejection has come back yet.
    """

    id: str
    status: CommandStatus
    command: str = ""
    location: str | None = None
    author: str = ""
    host: str = ""
    issued_at: float | None = None
    expires_at: float | None = None
    received_at: float | None = None
    resolved_at: float | None = None
    attempt: int | None = None
    detail: str = ""
    reason: str = ""
    error: str = ""
    owner: str = ""
    """The account that owned the command file when the job claimed it (``""``: unknown)."""
    spoofed: bool = False
    """The file's ``author`` names someone other than its owner."""

    @property
    def spoof_note(self) -> str:
        """``" (written by bob: spoofed author)"`` for a spoofed command, else ``""``."""
        return f" (written by {self.owner}: spoofed author)" if self.spoofed else ""


@dataclass
class Progress:
    """The latest progress: from the latest heartbeat, rank 0 preferred.

    ``step`` and ``t`` come from a later non-heartbeat event (a checkpoint save,
    a signal) when there is one.
    """

    t: float
    attempt: int
    rank: int
    step: int | None
    epoch: int | None
    time_left_s: float | None
    metrics: dict[str, float]


@dataclass
class BadLines:
    """Lines that were skipped: counts by reason and the last samples (by file, then line)."""

    counts: dict[str, int] = field(default_factory=dict)
    samples: list[BadLine] = field(default_factory=list)


@dataclass(frozen=True)
class AttemptTimes:
    """The times of one attempt that badput needs beyond :class:`AttemptInfo`
    (see :mod:`ckptdash.analysis.goodput` and docs/goodput.md). Times are Unix seconds."""

    attempt: int
    first_t: float | None
    """Its earliest event of any kind and rank (its start when it wrote no ``run_started``)."""
    first_step_t: float | None
    """The first training step it reported: its earliest heartbeat of any rank, or the start
    (``t − duration_s``) of its first save when that came earlier (a save is work done)."""
    saving_s: float
    """Blocking time of its saves: per rank the sum over its ``checkpoint_saved`` events of
    ``blocking_s`` (else ``duration_s``); the attempt's is the largest rank's."""
    saves: int
    """How many ``checkpoint_saved`` events that largest rank wrote."""
    last_save_t: float | None
    """Its latest ``checkpoint_saved`` (any rank): its last durable checkpoint."""


@dataclass(frozen=True)
class MetricPoint:
    """One rank-0 heartbeat's metrics, kept for the metrics plot (see ``RunState.metrics``)."""

    step: int
    t: float
    attempt: int
    metrics: dict[str, float]


@dataclass
class AnomalyInfo:
    """A metric that went bad (an ``anomaly`` event) and what the job did about it."""

    t: float
    attempt: int
    step: int | None
    metric: str
    value: float | None
    reason: str
    action: str
    pinned: str | None


@dataclass
class LoggerInfo:
    """The experiment-logger run the curves of this run go to (its newest ``logger_attached``)."""

    logger: str
    id: str
    location: str
    attempt: int
    step: int | None
    redone: str
    named: bool
    t: float


@dataclass
class RankInfo:
    """One rank of one attempt, from its pulses (and its other events).

    ``last_seen`` is the time of its latest event of any kind (its own host's clock);
    ``step_since`` the earliest time it was seen at ``step``: how long it has been stuck
    there is ``last_seen - step_since`` on its own clock, whatever the other hosts' clocks say.
    """

    rank: int
    host: str
    last_seen: float | None
    step: int | None
    step_since: float | None
    pulses: bool


@dataclass
class AlertRecord:
    """An ``alert_raised`` / ``alert_cleared`` / ``action_taken`` event, as the log has it."""

    t: float
    event: AlertEvent
    alert: str
    attempt: int
    source: str
    who: str
    detail: str = ""
    since: float | None = None
    action: str = ""
    command: str = ""
    ok: bool | None = None
