"""The run-directory contract: event records, commands and settings.

This module is the only thing the training side and the dashboard share. It
imports nothing else of ckptdash except the exceptions, so another tool can
copy its ideas (or read ``docs/format.md``) and speak the same format.

Every event is one JSON object on one line::

    {"kind":"checkpoint_saved","v":1,"t":1764430000.12,"run":"3f2a…","attempt":1,
     "rank":0,"host":"node17","step":1200,"path":"checkpoints/step=1200.ckpt",
     "size_bytes":52428800,"duration_s":0.41,"trigger":"signal","checksum":"xxh3_128:…"}

Writing is strict (:func:`validate` raises :class:`EventValidationError` naming
the field and the value); reading is lenient (:func:`decode_lines` never
raises: bad lines are returned as :class:`BadLine` records to be counted).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Final, Literal, TypeAlias, get_args

import msgspec

from ckptdash.errors import EventValidationError, MalformedControlFile

FORMAT_VERSION: Final = 1

Trigger: TypeAlias = Literal["periodic", "manual", "signal", "exception", "api", "final"]
TRIGGERS: Final[tuple[str, ...]] = get_args(Trigger)

MAX_INT: Final = 2**63 - 1
"""The largest step, attempt, rank, epoch or size a record may hold (a signed 64-bit integer):
larger numbers overflow the int64 columns of the views."""
MAX_TIME: Final = 2.0**32
"""The latest time (Unix seconds, in 2106) and the longest duration a record may hold. A node
with a broken clock writes years like 2300, which date libraries cannot draw; such a line is
counted as ``invalid`` instead of hiding every run of the folder."""

NonNegInt = Annotated[int, msgspec.Meta(ge=0, le=MAX_INT)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0, le=MAX_TIME)]
Seconds = Annotated[float, msgspec.Meta(ge=-MAX_TIME, le=MAX_TIME)]
NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]

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
    """The training side claimed a command from the inbox."""

    command_id: NonEmptyStr
    command: str


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

# Events whose loss would lose a fact a user acts on: the writer fsyncs these before returning.
DURABLE_KINDS: Final = frozenset(
    {
        "run_started",
        "run_resumed",
        "run_finished",
        "run_failed",
        "checkpoint_saved",
        "checkpoint_failed",
        "checkpoint_removed",
        "checkpoint_dir_declared",
        "signal_received",
        "requeue_issued",
        "requeue_skipped",
        "command_received",
        "command_applied",
        "command_rejected",
        "command_expired",
        "control_failed",
        "exception",
        "anomaly",
        "alert_raised",
        "alert_cleared",
        "action_taken",
    }
)

_encoder = msgspec.json.Encoder()
_lenient_decoder = msgspec.json.Decoder(AnyEvent)
_strict_decoders = {kind: msgspec.json.Decoder(cls, strict=True) for kind, cls in KINDS.items()}


def encode(event: Event) -> bytes:
    """Validate ``event`` and return it as one JSON line (with the trailing newline).

    Raises :class:`EventValidationError` naming the field and the value when the
    event breaks the schema, so an invalid record never reaches a log.
    """
    data = _encoder.encode(event)
    try:
        _strict_decoders[event.KIND].decode(data)
    except msgspec.ValidationError as exc:
        raise EventValidationError(_describe(event, str(exc))) from None
    return data + b"\n"


def validate(event: Event) -> None:
    """Raise :class:`EventValidationError` if ``event`` would not be written."""
    encode(event)


def _describe(event: Event, msgspec_message: str) -> str:
    # msgspec says "Expected `int`, got `str` - at `$.step`"; add the offending value.
    field = msgspec_message.rsplit("$.", 1)[-1].rstrip("`") if "$." in msgspec_message else ""
    value = getattr(event, field, None) if field else None
    where = f"field {field!r} = {value!r}" if field else "event"
    return f"invalid {event.KIND} event: {where}: {msgspec_message}"


def encode_metrics(metrics: dict[str, Any] | None) -> msgspec.Raw:
    """Encode a metrics mapping for :class:`Heartbeat`; values must be numbers (or None)."""
    if not metrics:
        return EMPTY_METRICS
    for name, value in metrics.items():
        if not isinstance(name, str) or not (
            value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))
        ):
            raise EventValidationError(
                f"invalid heartbeat metric {name!r} = {value!r}: metrics must map names to numbers;"
                " convert tensors with float(x)"
            )
    return msgspec.Raw(_encoder.encode(metrics))


def decode_metrics(raw: msgspec.Raw) -> dict[str, float]:
    """Decode a heartbeat's metrics; a malformed value gives an empty mapping (lenient read).

    Only numbers are kept (a NaN loss, written as ``null``, stays ``None``); anything else,
    and an integer too large to become a float, is left out, so no view meets an absurd value.
    """
    try:
        value = msgspec.json.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return {}
    if not isinstance(value, dict):
        return {}
    return {
        k: v
        for k, v in value.items()
        if v is None or (type(v) in (int, float) and -_MAX_METRIC <= v <= _MAX_METRIC)
    }


_MAX_METRIC: Final = 1e300  # float(int) of anything larger may overflow


# --- lenient reading -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BadLine:
    """A line that was skipped while reading, with the reason; counted, shown, never raised."""

    file: str
    line: int
    reason: Literal["corrupt", "unknown_kind", "invalid", "oversize"]
    detail: str


def decode_line(line: bytes, file: str = "", lineno: int = 0) -> Event | BadLine:
    """Decode one line leniently: an :class:`Event` or a :class:`BadLine` saying why not."""
    try:
        return _lenient_decoder.decode(line)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return _classify(line, file, lineno, exc)


def decode_lines(buf: bytes, file: str = "", first_lineno: int = 1) -> list[Event | BadLine]:
    """Decode complete newline-terminated lines; bad lines come back as :class:`BadLine`.

    The fast path decodes the whole buffer in one call; only a buffer with a bad
    line falls back to line-by-line decoding.
    """
    try:
        return list(_lenient_decoder.decode_lines(buf))
    except (msgspec.ValidationError, msgspec.DecodeError):
        pass
    out: list[Event | BadLine] = []
    for offset, line in enumerate(buf.split(b"\n")):
        if line.strip():
            out.append(decode_line(line, file, first_lineno + offset))
    return out


def _classify(line: bytes, file: str, lineno: int, exc: Exception) -> BadLine:
    try:
        obj = msgspec.json.decode(line)
    except msgspec.DecodeError:
        return BadLine(file, lineno, "corrupt", _clip(line))
    if isinstance(obj, dict) and isinstance(obj.get("kind"), str) and obj["kind"] not in KINDS:
        return BadLine(file, lineno, "unknown_kind", str(obj["kind"]))
    return BadLine(file, lineno, "invalid", str(exc))


def _clip(line: bytes, limit: int = 80) -> str:
    text = line.decode("utf-8", "replace")
    return text if len(text) <= limit else text[:limit] + "…"


# --- commands (dashboard/CLI -> training) ----------------------------------------------------


class Command(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="command", forbid_unknown_fields=True
):
    """A one-shot request from a person to the running job, one file in ``control/inbox/``.

    ``expires_at`` is Unix time after which the training side answers
    ``command_expired`` instead of acting.
    """

    NAME: ClassVar[str]

    v: int = FORMAT_VERSION
    id: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    t: NonNegFloat
    author: str
    host: str
    expires_at: NonNegFloat | None = None


class SaveNow(Command, frozen=True, tag="save_now"):
    """Save a checkpoint (trigger ``manual``) at the next step boundary."""


class StopAfterSave(Command, frozen=True, tag="stop_after_save"):
    """Save a checkpoint at the next step boundary, then end the job without requeue."""


AnyCommand: TypeAlias = SaveNow | StopAfterSave
COMMAND_TYPES: Final[tuple[type[Command], ...]] = get_args(AnyCommand)
COMMANDS: Final[dict[str, type[Command]]] = {}
for _ccls in COMMAND_TYPES:
    _ctag = _ccls.__struct_config__.tag
    assert isinstance(_ctag, str)
    _ccls.NAME = _ctag
    COMMANDS[_ctag] = _ccls

_command_decoder = msgspec.json.Decoder(AnyCommand, strict=True)


def encode_command(command: Command) -> bytes:
    """Validate and encode a command file's content."""
    data = _encoder.encode(command)
    try:
        _command_decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise EventValidationError(f"invalid {command.NAME} command: {exc}") from None
    return data + b"\n"


def decode_command(data: bytes, file: str) -> Command:
    """Parse a command file; :class:`MalformedControlFile` names ``file`` and the problem."""
    try:
        return _command_decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        known = ", ".join(sorted(COMMANDS))
        raise MalformedControlFile(
            f"{file}: not a ckptdash command ({exc}); expected a JSON object with"
            f' "command" one of {known} — create commands with `ckptdash save`/`ckptdash stop`'
        ) from None


# --- settings (durable, read fresh at decision time) -----------------------------------------


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The durable policy in ``control/settings.json``; replaced atomically as a whole."""

    v: int = FORMAT_VERSION
    requeue_suspended: bool = False
    resume_pin: str | None = None
    health: dict[str, float] = msgspec.field(default_factory=dict)
    """Health thresholds of this run by name (``ckptdash health RUN --set NAME=VALUE``)."""
    updated_at: NonNegFloat = 0.0
    updated_by: str = ""


_settings_decoder = msgspec.json.Decoder(Settings, strict=True)


def encode_settings(settings: Settings) -> bytes:
    """Encode the settings file's content."""
    return msgspec.json.format(_encoder.encode(settings), indent=2) + b"\n"


def decode_settings(data: bytes, file: str) -> Settings:
    """Parse the settings file; raises :class:`MalformedControlFile` naming the file and the fix."""
    try:
        return _settings_decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise MalformedControlFile(
            f"{file}: unreadable settings ({exc}); fix the file by hand or rewrite it with"
            " `ckptdash requeue RUN_DIR --resume` / `ckptdash resume RUN_DIR --clear`"
        ) from None


def to_builtins(obj: Event | Command | Settings) -> dict[str, Any]:
    """A JSON-ready dict of any record (for ``status --json`` and tests)."""
    # Round-trip through JSON so raw fields (heartbeat metrics) become plain values.
    out = msgspec.json.decode(_encoder.encode(obj))
    assert isinstance(out, dict)
    return out
