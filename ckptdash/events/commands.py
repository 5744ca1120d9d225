"""The control files' schema: one-shot commands and the durable settings (docs/format.md).

:mod:`ckptdash.control` moves these files; this module only says what they contain, and
:mod:`ckptdash.events` re-exports every name here for readers of the format.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Final, TypeAlias, get_args

import msgspec

from ckptdash.errors import EventValidationError, MalformedControlFile
from ckptdash.events.fields import DECODE_ERRORS, FORMAT_VERSION, NonNegFloat, encoder

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
    data = encoder.encode(command)
    try:
        _command_decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise EventValidationError(f"invalid {command.NAME} command: {exc}") from None
    return data + b"\n"


def decode_command(data: bytes, file: str) -> Command:
    """Parse a command file; :class:`MalformedControlFile` names ``file`` and the problem."""
    try:
        return _command_decoder.decode(data)
    except DECODE_ERRORS as exc:
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
    resume_pin_sticky: bool = False
    """Keep the pin after an attempt loaded it (``ckptdash resume RUN --pin PATH --sticky``);
    by default the attempt that loads a pinned checkpoint consumes the pin."""
    fresh_start: bool = False
    """The next attempt starts fresh (``ckptdash resume RUN --fresh``): it records a fresh-start
    boundary in the log (``run_started`` with ``fresh``) and clears this setting; checkpoints
    from before the boundary are never chosen again."""
    health: dict[str, float] = msgspec.field(default_factory=dict)
    """Health thresholds of this run by name (``ckptdash health RUN --set NAME=VALUE``)."""
    group_steering: bool = False
    """The project group may send commands (``ckptdash steer RUN --group``): the owner's next
    attempt opens ``control/group-inbox/`` to the group. Honoured only in a settings file the
    run's owner wrote; without it the inbox is the owner's alone."""
    updated_at: NonNegFloat = 0.0
    updated_by: str = ""


_settings_decoder = msgspec.json.Decoder(Settings, strict=True)


# Fields added after a release, written only when set: a reader of that release forbids unknown
# fields, so a run that never uses the newer setting stays readable (and steerable) by it.
_WRITTEN_WHEN_SET = ("group_steering",)


def encode_settings(settings: Settings) -> bytes:
    """Encode the settings file's content (the newer fields only when they are set)."""
    fields = msgspec.structs.asdict(settings)
    for name in _WRITTEN_WHEN_SET:
        if not fields[name]:
            del fields[name]
    return msgspec.json.format(encoder.encode(fields), indent=2) + b"\n"


def decode_settings(data: bytes, file: str) -> Settings:
    """Parse the settings file; raises :class:`MalformedControlFile` naming the file and the fix."""
    try:
        return _settings_decoder.decode(data)
    except DECODE_ERRORS as exc:
        raise MalformedControlFile(
            f"{file}: unreadable settings ({exc}); fix the file by hand or rewrite it with"
            " `ckptdash requeue RUN_DIR --resume` / `ckptdash resume RUN_DIR --clear`"
        ) from None
