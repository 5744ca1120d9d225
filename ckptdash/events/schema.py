"""The event records: one frozen class per kind, tagged by its ``kind`` (docs/format.md).

:mod:`ckptdash.events` re-exports every name here and adds the encoding, the lenient
decoding and the groups of kinds; import from there.
"""

from __future__ import annotations

from typing import ClassVar, Final, TypeAlias, get_args

import msgspec

from ckptdash.events.fields import (
    FORMAT_VERSION,
    NonEmptyStr,
    NonNegFloat,
    NonNegInt,
    Seconds,
    Trigger,
)

EMPTY_METRICS: Final = msgspec.Raw(b"{}")


class Event(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    tag_field="kind",
    gc=False,  # events hold no cycles; skipping the GC doubles load speed
    omit_defaults=False,
):
    """Fields every event carries.

    ``t`` is Unix time in seconds (float). ``attempt`` counts from 0 (the
    scheduler's restart count). ``step`` is the global optimizer step the
    event refers to, or ``None`` when there is none yet.
    """

    KIND: ClassVar[str]

    v: int = FORMAT_VERSION
    t: NonNegFloat
    run: NonEmptyStr
    attempt: NonNegInt
    rank: NonNegInt = 0
    host: str = ""
    step: NonNegInt | None = None


# --- run lifecycle ---------------------------------------------------------------------------


class RunStarted(Event, frozen=True, tag="run_started"):
    """An attempt began: which scheduler and job it runs under."""

    scheduler: str = "local"
    job_id: str | None = None
    world_size: NonNegInt = 1
    pid: NonNegInt | None = None
    max_steps: NonNegInt | None = None
    requeue_budget: NonNegInt | None = None
    fresh: str = ""
    """Why this attempt starts fresh (``ckptdash resume RUN --fresh``, ``fresh=`` given to the
    Monitor or callback); "" when it does not. A fresh-start boundary: no checkpoint recorded
    by an earlier attempt is a resume candidate any more (docs/resume-rule.md)."""


class RunResumed(Event, frozen=True, tag="run_resumed"):
    """The attempt loaded a checkpoint; ``reason`` says why that one (the resume rule)."""

    path: NonEmptyStr
    reason: str


class RunFinished(Event, frozen=True, tag="run_finished"):
    """The attempt ended on purpose: training complete, or stopped for requeue/preemption."""

    reason: str = "completed"


class RunFailed(Event, frozen=True, tag="run_failed"):
    """The attempt ended with an error."""

    error: str


class Heartbeat(Event, frozen=True, tag="heartbeat"):
    """Progress: step, epoch, metrics (a raw JSON object of numbers) and time left."""

    epoch: NonNegInt | None = None
    metrics: msgspec.Raw = EMPTY_METRICS
    time_left_s: Seconds | None = None


# --- checkpoints -----------------------------------------------------------------------------


class CheckpointStarted(Event, frozen=True, tag="checkpoint_started"):
    """A save began writing ``path``."""

    path: NonEmptyStr
    trigger: Trigger


class CheckpointSaved(Event, frozen=True, tag="checkpoint_saved"):
    """``path`` is durable: renamed into place and fsync'ed. It exists only from this event on."""

    path: NonEmptyStr
    trigger: Trigger
    size_bytes: NonNegInt
    duration_s: NonNegFloat
    checksum: str = ""
    epoch: NonNegInt | None = None
    blocking_s: NonNegFloat | None = None
    """How long the save stalled training; absent: all of ``duration_s`` (a synchronous
    save). An asynchronous save stalls only while it stages a copy in memory."""
    monitored: dict[str, float] | None = None
    """The metric a Lightning ``ModelCheckpoint`` monitors and its value at this save
    (``{"val_loss": 0.31}``; one entry per ModelCheckpoint with a ``monitor``)."""
    written_at: str | None = None
    """Where a framework's CheckpointIO handed ``path`` really wrote the files (a plugin
    that redirects): what ckptdash fsynced, checksummed and validates. ``path`` stays what
    a resume hands back to that IO to load."""
    unvalidated: str | None = None
    """Why ckptdash could not see the files a CheckpointIO wrote for ``path`` (then
    ``size_bytes`` is 0 and there is no checksum: the IO's own load is the only check)."""
    artifact: str | None = None
    """Why this checkpoint cannot resume training: an artifact (weights only, an export, a
    model alone), e.g. ``"weights only: ModelCheckpoint(save_weights_only=True)"``. Absent
    (older runs too): it holds model, optimizer and loop state, and resumes training. The
    resume rule passes artifacts over (docs/resume-rule.md, Two kinds of checkpoint)."""
    same_as: str | None = None
    """``path`` is a symbolic link to (or a copy of) the checkpoint recorded at ``same_as``,
    an absolute path: Lightning's ``last.ckpt`` under ``save_last="link"``, or its
    ``last.ckpt`` after a signal save. Same step, same bytes; a resume loads ``same_as``."""


class CheckpointFailed(Event, frozen=True, tag="checkpoint_failed"):
    """A save did not complete; the previous file of that name (if any) is intact."""

    path: NonEmptyStr
    trigger: Trigger
    error: str


class CheckpointRemoved(Event, frozen=True, tag="checkpoint_removed"):
    """A checkpoint was deleted (rotation) or replaced; it is no longer a resume candidate."""

    path: NonEmptyStr
    reason: str = ""


class CheckpointInvalid(Event, frozen=True, tag="checkpoint_invalid"):
    """A recorded checkpoint failed validation (missing, wrong size, wrong checksum)."""

    path: NonEmptyStr
    reason: str


class CheckpointDirDeclared(Event, frozen=True, tag="checkpoint_dir_declared"):
    """This run saves checkpoints in ``path`` (an absolute directory outside the run directory,
    or inside it). Only checkpoints inside the run directory or a declared directory count."""

    path: NonEmptyStr


# --- signals and requeue ---------------------------------------------------------------------


class SignalReceived(Event, frozen=True, tag="signal_received"):
    """A signal arrived; ``action`` is what the configuration says it means."""

    signal: NonEmptyStr
    action: str = ""


class RequeueIssued(Event, frozen=True, tag="requeue_issued"):
    """The job asked its scheduler to run it again."""

    job_id: str | None = None
    command: str = ""


class RequeueSkipped(Event, frozen=True, tag="requeue_skipped"):
    """A requeue was due but not made; ``reason`` says why (suspended, budget, no scheduler)."""

    reason: str


# --- commands (the answers of the training side) ---------------------------------------------


class CommandReceived(Event, frozen=True, tag="command_received"):
    """The training side claimed a command from the inbox.

    ``owner`` is the account that owns the command file (its ``fstat``), next to the author
    the file claims; ``spoofed`` is true when the two differ (a file written by one account
    and signed with another's name). Both are optional: older writers leave them out.
    """

    command_id: NonEmptyStr
    command: str
    owner: str | None = None
    spoofed: bool = False


class CommandApplied(Event, frozen=True, tag="command_applied"):
    """The command was carried out; ``detail`` holds e.g. the checkpoint path."""

    command_id: NonEmptyStr
    command: str
    detail: str = ""


class CommandRejected(Event, frozen=True, tag="command_rejected"):
    """The command was refused, with the reason (malformed, unknown, not allowed now)."""

    command_id: NonEmptyStr
    reason: str
    command: str = ""


class CommandExpired(Event, frozen=True, tag="command_expired"):
    """The command was never applied: it timed out, or its claimer died before answering."""

    command_id: NonEmptyStr
    reason: str
    command: str = ""


class ControlFailed(Event, frozen=True, tag="control_failed"):
    """The control channel failed (a command could not be claimed or moved to ``done/``);
    training goes on. ``command_id`` names the command concerned, if any."""

    reason: str
    command_id: str | None = None


class ExceptionRaised(Event, frozen=True, tag="exception"):
    """An exception escaped the training step (recorded before any exception save)."""

    error_type: str
    message: str
    traceback: str = ""


class AnomalyDetected(Event, frozen=True, tag="anomaly"):
    """A watched metric went bad at ``step``: not finite, or a spike above a factor of its
    recent median. ``value`` is None when it was not finite (JSON has no NaN); ``action`` is
    what the job did (``record``, ``stop``, ``rollback``); ``pinned`` the checkpoint a
    rollback pinned for the next attempt."""

    metric: NonEmptyStr
    value: float | None
    reason: str = ""
    action: str = "record"
    pinned: str | None = None


# --- experiment loggers ------------------------------------------------------------------


class LoggerAttached(Event, frozen=True, tag="logger_attached"):
    """This attempt logs its curves into one run of an experiment logger (TensorBoard, W&B,
    MLflow, CSV, ...): every attempt of the run into the same one. ``logger`` names the
    logger (``tensorboard``, ``wandb``, ``mlflow``, ``csv``; a second of a kind gets ``#2``),
    ``id`` its own run id or version, ``location`` where its curves are (a folder, a tracking
    URI, a project). The envelope's ``step`` is the step this attempt continues from;
    ``redone`` says what becomes of the steps after it that an earlier attempt logged:
    ``replaced`` (the new values replace them), ``dropped`` (the logger cannot replace: the
    new values are not logged up to the highest step logged before), or empty (nothing was
    logged after it). ``named``: the user chose the id, ckptdash did not."""

    logger: NonEmptyStr
    id: str = ""
    location: str = ""
    redone: str = ""
    named: bool = False


# --- health (every rank's pulse; alerts and what was done about them) -----------------------


class Pulse(Event, frozen=True, tag="pulse"):
    """A rank is alive and at ``step``: written by every rank about once a second, no fsync.

    The ``step`` field of the envelope carries the progress; a pulse whose step did not
    change since the last one says "alive but not advancing" (a hang, not a crash).
    """


class AlertRaised(Event, frozen=True, tag="alert_raised"):
    """A health detector fired (see ``docs/health.md``): ``alert`` is the detector's name.

    ``source`` is ``watch`` (a ``ckptdash watch`` process) or ``job`` (the training
    process's own watchdog); ``who`` names the user and host (and rank) that recorded it.
    """

    alert: NonEmptyStr
    since: NonNegFloat
    detail: str = ""
    source: str = "watch"
    who: str = ""


class AlertCleared(Event, frozen=True, tag="alert_cleared"):
    """An alert raised earlier by the same ``source`` no longer holds."""

    alert: NonEmptyStr
    detail: str = ""
    source: str = "watch"
    who: str = ""


class ActionTaken(Event, frozen=True, tag="action_taken"):
    """A rule acted on an alert (``--on hung=requeue``): the command run and its result."""

    alert: NonEmptyStr
    action: NonEmptyStr
    command: str
    ok: bool
    result: str = ""
    source: str = "watch"
    who: str = ""


AnyEvent: TypeAlias = (
    RunStarted
    | RunResumed
    | RunFinished
    | RunFailed
    | Heartbeat
    | CheckpointStarted
    | CheckpointSaved
    | CheckpointFailed
    | CheckpointRemoved
    | CheckpointInvalid
    | CheckpointDirDeclared
    | SignalReceived
    | RequeueIssued
    | RequeueSkipped
    | CommandReceived
    | CommandApplied
    | CommandRejected
    | CommandExpired
    | ControlFailed
    | ExceptionRaised
    | AnomalyDetected
    | LoggerAttached
    | Pulse
    | AlertRaised
    | AlertCleared
    | ActionTaken
)

EVENT_TYPES: Final[tuple[type[Event], ...]] = get_args(AnyEvent)
KINDS: Final[dict[str, type[Event]]] = {}
for _cls in EVENT_TYPES:
    _tag = _cls.__struct_config__.tag
    assert isinstance(_tag, str)
    _cls.KIND = _tag
    KINDS[_tag] = _cls
