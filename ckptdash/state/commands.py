"""Commands as :class:`~ckptdash.state.RunState` sees them: the latest sighting of each
command's file and the training side's answers (:func:`command_info`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, TypeAlias

from ckptdash import events as ev_
from ckptdash.state.records import CommandInfo, CommandStatus
from ckptdash.state.streams import Key

if TYPE_CHECKING:
    from ckptdash.tail import CommandFile

Outcome: TypeAlias = "ev_.CommandApplied | ev_.CommandRejected | ev_.CommandExpired"
COMMAND_OUTCOMES: Final[dict[str, CommandStatus]] = {
    "command_applied": "applied",
    "command_rejected": "rejected",
    "command_expired": "expired",
}
"""Each outcome event kind and the status it gives its command."""


class Command:
    """One command id: its file as last seen, its earliest receipt, its first outcome."""

    __slots__ = ("file", "outcome", "received")

    def __init__(self) -> None:
        self.file: CommandFile | None = None
        self.received: tuple[Key, ev_.CommandReceived] | None = None  # the earliest
        self.outcome: tuple[Key, Outcome] | None = None  # the first

    def on_received(self, ev: ev_.CommandReceived, k: Key) -> None:
        if self.received is None or k < self.received[0]:
            self.received = (k, ev)

    def on_outcome(self, ev: Outcome, k: Key) -> None:
        # The first outcome is the command's: a later one (a replayed file rejected) must not
        # turn an applied command into a rejected one.
        if self.outcome is None or k < self.outcome[0]:
            self.outcome = (k, ev)


def command_info(cid: str, c: Command) -> CommandInfo:
    """Where command ``cid`` stands; the training side's answer outranks its file's place."""
    info = CommandInfo(cid, "pending")
    f = c.file
    if f is not None:
        info.location = f.location
        if f.command is not None:
            cmd = f.command
            info.command, info.author, info.host = cmd.NAME, cmd.author, cmd.host
            info.issued_at, info.expires_at = cmd.t, cmd.expires_at
        info.error = f.error or ""
    if c.received is not None:
        rec = c.received[1]
        info.received_at, info.attempt = rec.t, rec.attempt
        info.owner, info.spoofed = rec.owner or "", rec.spoofed
        info.command = info.command or rec.command
    if c.outcome is not None:
        out = c.outcome[1]
        info.status = COMMAND_OUTCOMES[out.KIND]
        info.resolved_at, info.attempt = out.t, out.attempt
        info.command = info.command or out.command
        if isinstance(out, ev_.CommandApplied):
            info.detail = out.detail
        else:
            info.reason = out.reason
    elif f is not None and f.error is not None:
        info.status = "malformed"
    elif c.received is not None or (f is not None and f.location != "inbox"):
        info.status = "received"
    return info
