"""What a poll of a run directory found: the records :class:`~ckptdash.tail.RunTailer` hands out.

Import these from :mod:`ckptdash.tail`; they live apart so that the event-file reader and the
command-folder reader (:mod:`ckptdash.tail.commands`) share them without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias

from ckptdash.events import BadLine, Command, Event, Pulse

Location: TypeAlias = Literal["inbox", "claimed", "done"]
LOCATIONS: Final[tuple[Location, ...]] = ("inbox", "claimed", "done")
"""Where a command file can be, in the only order it moves."""


@dataclass(frozen=True, slots=True)
class CommandFile:
    """A command file as seen in ``control/``: reported when first seen and on every move.

    ``command`` is the parsed command, or ``None`` with ``error`` saying why the
    file does not parse (or cannot be read).
    """

    id: str
    location: Location
    command: Command | None
    error: str | None
    mtime: float


@dataclass(slots=True)
class TailBatch:
    """What one poll found: new events and bad lines (file order), new or moved command files."""

    events: list[Event] = field(default_factory=list)
    bad: list[BadLine] = field(default_factory=list)
    commands: list[CommandFile] = field(default_factory=list)
    pulses: list[Pulse] = field(default_factory=list)
    """Each changed pulse record as two pulses (:mod:`ckptdash.tail.pulses`): not log lines,
    so never counted as events."""

    def __len__(self) -> int:
        return len(self.events) + len(self.bad) + len(self.commands) + len(self.pulses)

    def __bool__(self) -> bool:
        return bool(self.events or self.bad or self.commands or self.pulses)

    def extend(self, other: TailBatch) -> None:
        """Append ``other``'s records after this batch's own."""
        self.events.extend(other.events)
        self.bad.extend(other.bad)
        self.commands.extend(other.commands)
        self.pulses.extend(other.pulses)


@dataclass(frozen=True, slots=True)
class Position:
    """How far a :class:`~ckptdash.tail.RunTailer` has read one event file: the byte after the
    last complete line (``offset``), the number of the next line, the file's inode, the bytes
    of an oversize line searched so far, and whether line 1 agreed with the name and run.json
    (``first``: "" when it did, why not when it did not, None before line 1 was read)."""

    offset: int
    lineno: int
    ino: int
    scanned: int = 0
    first: str | None = None
