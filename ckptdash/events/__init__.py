"""The run-directory contract: event records, commands and settings.

This module is the only thing the training side and the dashboard share. It and the
modules it gathers (:mod:`ckptdash.events.schema` the records, :mod:`ckptdash.events.commands`
the commands and settings, :mod:`ckptdash.events.fields` the field types) import nothing
else of ckptdash except the exceptions, so another tool can copy its ideas (or read
``docs/format.md``) and speak the same format. Import every name from here.

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
from typing import Any, Final, Literal

import msgspec

from ckptdash.errors import EventValidationError
from ckptdash.events.commands import (
    COMMAND_TYPES,
    COMMANDS,
    AnyCommand,
    Command,
    SaveNow,
    Settings,
    StopAfterSave,
    decode_command,
    decode_settings,
    encode_command,
    encode_settings,
)
from ckptdash.events.fields import (
    DECODE_ERRORS,
    FORMAT_VERSION,
    MAX_INT,
    MAX_TIME,
    TRIGGERS,
    NonEmptyStr,
    NonNegFloat,
    NonNegInt,
    Seconds,
    Trigger,
)
from ckptdash.events.fields import encoder as _encoder
from ckptdash.events.schema import (
    EMPTY_METRICS,
    EVENT_TYPES,
    KINDS,
    ActionTaken,
    AlertCleared,
    AlertRaised,
    AnomalyDetected,
    AnyEvent,
    CheckpointDirDeclared,
    CheckpointFailed,
    CheckpointInvalid,
    CheckpointRemoved,
    CheckpointSaved,
    CheckpointStarted,
    CommandApplied,
    CommandExpired,
    CommandReceived,
    CommandRejected,
    ControlFailed,
    Event,
    ExceptionRaised,
    Heartbeat,
    LoggerAttached,
    Pulse,
    RequeueIssued,
    RequeueSkipped,
    RunFailed,
    RunFinished,
    RunResumed,
    RunStarted,
    SignalReceived,
)

__all__ = [
    "CHECKPOINT_EVENTS",
    "CHECKPOINT_KINDS",
    "COMMANDS",
    "COMMAND_EVENTS",
    "COMMAND_KINDS",
    "COMMAND_OUTCOME_EVENTS",
    "COMMAND_OUTCOME_KINDS",
    "COMMAND_TYPES",
    "DURABLE_KINDS",
    "EMPTY_METRICS",
    "EVENT_TYPES",
    "FORMAT_VERSION",
    "KINDS",
    "MAX_INT",
    "MAX_TIME",
    "TRIGGERS",
    "ActionTaken",
    "AlertCleared",
    "AlertRaised",
    "AnomalyDetected",
    "AnyCommand",
    "AnyEvent",
    "BadLine",
    "CheckpointDirDeclared",
    "CheckpointFailed",
    "CheckpointInvalid",
    "CheckpointRemoved",
    "CheckpointSaved",
    "CheckpointStarted",
    "Command",
    "CommandApplied",
    "CommandExpired",
    "CommandReceived",
    "CommandRejected",
    "ControlFailed",
    "Event",
    "ExceptionRaised",
    "Heartbeat",
    "LoggerAttached",
    "NonEmptyStr",
    "NonNegFloat",
    "NonNegInt",
    "Pulse",
    "RequeueIssued",
    "RequeueSkipped",
    "RunFailed",
    "RunFinished",
    "RunResumed",
    "RunStarted",
    "SaveNow",
    "Seconds",
    "Settings",
    "SignalReceived",
    "StopAfterSave",
    "Trigger",
    "decode_command",
    "decode_line",
    "decode_lines",
    "decode_metrics",
    "decode_settings",
    "encode",
    "encode_command",
    "encode_metrics",
    "encode_settings",
    "to_builtins",
    "validate",
]

# The groups of kinds that several readers treat alike, defined here once.
CHECKPOINT_EVENTS: Final[tuple[type[Event], ...]] = (
    CheckpointStarted,
    CheckpointSaved,
    CheckpointFailed,
    CheckpointRemoved,
    CheckpointInvalid,
    CheckpointDirDeclared,  # a checkpoint outside the run directory may count from now on
)
"""The records that decide what a checkpoint is (and what the checkpoint table shows)."""
CHECKPOINT_KINDS: Final[tuple[str, ...]] = tuple(cls.KIND for cls in CHECKPOINT_EVENTS)
COMMAND_OUTCOME_EVENTS: Final[tuple[type[Event], ...]] = (
    CommandApplied,
    CommandRejected,
    CommandExpired,
)
"""The training side's final answer to a command: exactly one per command."""
COMMAND_OUTCOME_KINDS: Final[tuple[str, ...]] = tuple(cls.KIND for cls in COMMAND_OUTCOME_EVENTS)
COMMAND_EVENTS: Final[tuple[type[Event], ...]] = (CommandReceived, *COMMAND_OUTCOME_EVENTS)
"""Every answer of the training side to a command, the claim first."""
COMMAND_KINDS: Final[tuple[str, ...]] = tuple(cls.KIND for cls in COMMAND_EVENTS)

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
        "logger_attached",
        "alert_raised",
        "alert_cleared",
        "action_taken",
    }
)

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
    except DECODE_ERRORS:
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
    except DECODE_ERRORS as exc:
        return _classify(line, file, lineno, exc)


def decode_lines(buf: bytes, file: str = "", first_lineno: int = 1) -> list[Event | BadLine]:
    """Decode complete newline-terminated lines; bad lines come back as :class:`BadLine`.

    The fast path decodes the whole buffer in one call; only a buffer with a bad
    line falls back to line-by-line decoding.
    """
    try:
        return list(_lenient_decoder.decode_lines(buf))
    except DECODE_ERRORS:
        pass
    out: list[Event | BadLine] = []
    for offset, line in enumerate(buf.split(b"\n")):
        if line.strip():
            out.append(decode_line(line, file, first_lineno + offset))
    return out


def _classify(line: bytes, file: str, lineno: int, exc: Exception) -> BadLine:
    try:
        obj = msgspec.json.decode(line)
    except DECODE_ERRORS:
        return BadLine(file, lineno, "corrupt", _clip(line))
    if isinstance(obj, dict) and isinstance(obj.get("kind"), str) and obj["kind"] not in KINDS:
        return BadLine(file, lineno, "unknown_kind", str(obj["kind"]))
    return BadLine(file, lineno, "invalid", str(exc))


def _clip(line: bytes, limit: int = 80) -> str:
    text = line.decode("utf-8", "replace")
    return text if len(text) <= limit else text[:limit] + "…"


def to_builtins(obj: Event | Command | Settings) -> dict[str, Any]:
    """A JSON-ready dict of any record (for ``status --json`` and tests)."""
    # Round-trip through JSON so raw fields (heartbeat metrics) become plain values.
    out = msgspec.json.decode(_encoder.encode(obj))
    assert isinstance(out, dict)
    return out
