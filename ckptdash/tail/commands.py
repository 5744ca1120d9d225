"""Watching the control folders: each command file reported when it first appears and on
every move (``control/inbox`` -> ``claimed`` -> ``done``), parsed with the claimer's own checks.

Part of :class:`~ckptdash.tail.RunTailer`'s poll; a file that moves while it is being looked at
is followed forward, never reported twice in one place.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from ckptdash.control import COMMAND_SUFFIX, is_not_a_command, read_command, safe_name
from ckptdash.control.dirs import control_fd
from ckptdash.errors import ControlError, MalformedControlFile, UnreadableControlFile
from ckptdash.events import Command
from ckptdash.rundir import RunDir
from ckptdash.rundir.safe_read import open_dir
from ckptdash.tail.batch import LOCATIONS, CommandFile, Location, TailBatch

Report: TypeAlias = Callable[[str, str, OSError], TailBatch]
"""How the tailer reports an unreadable folder: (file, what failed, the error) -> a batch."""


@dataclass(slots=True)
class _Known:
    """The last reported state of one command file."""

    location: Location
    command: Command | None
    error: str | None
    mtime: float
    unreadable: bool  # error came from reading, not parsing: read it again when it moves


class CommandFolders:
    """The command files of one run directory, and where each was last reported."""

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir
        self._commands: dict[str, _Known] = {}

    def poll(self, report: Report, reported: set[tuple[str, str]]) -> TailBatch:
        """Command files new or moved since the last poll. A folder that cannot be listed is
        reported through ``report`` (once, by the tailer), and discarded from ``reported``
        once it can be listed again."""
        out = TailBatch()
        seen: dict[str, tuple[int, str]] = {}  # id -> (index of the furthest location, name)
        for index, location in enumerate(LOCATIONS):
            try:
                names = _listing(self.run_dir, location)
            except FileNotFoundError:
                continue
            except (OSError, ControlError) as exc:
                error = exc if isinstance(exc, OSError) else OSError(0, str(exc))
                out.extend(report(f"control/{LOCATIONS[index]}/", "list the folder", error))
                continue
            reported.discard((f"control/{LOCATIONS[index]}/", "list the folder"))
            for name in names:
                if is_not_a_command(name):
                    continue
                # A file moving while we list can show up twice; moves only go forward.
                seen[safe_name(name.removesuffix(COMMAND_SUFFIX) or name)] = (index, name)
        for cid in sorted(seen):
            index, name = seen[cid]
            known = self._commands.get(cid)
            if known is not None and known.location == LOCATIONS[index]:
                continue
            found = self._look_up(cid, name, index, known)
            if found is not None:
                self._commands[cid] = found
                out.commands.append(
                    CommandFile(cid, found.location, found.command, found.error, found.mtime)
                )
        return out

    def _look_up(self, cid: str, name: str, index: int, known: _Known | None) -> _Known | None:
        """Read the file where it was listed, following it forward if it moved since."""
        dirs = (self.run_dir.inbox, self.run_dir.claimed, self.run_dir.done)
        for i in range(index, len(LOCATIONS)):
            path = dirs[i] / name
            location = LOCATIONS[i]
            if known is not None and known.location == location:
                return None  # it was already reported here
            try:
                if known is not None and not known.unreadable:
                    mtime = os.stat(path).st_mtime
                    return _Known(location, known.command, known.error, mtime, False)
                return _read_command(path, location)
            except FileNotFoundError:
                continue  # renamed by a claimer just now: look in the next folder
        return None


def _listing(run: RunDir, location: Location) -> list[str]:
    """Names in ``control/<location>``, listed without following a link at either level: a
    folder swapped for a link to someone's private folder is reported, never listed."""
    with control_fd(run) as control:
        fd = open_dir(location, dir_fd=control)
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def _read_command(path: Path, location: Location) -> _Known:
    """Read and parse one command file with the claimer's own checks (so a file shown as
    malformed here is one the training side will answer with ``command_rejected``).
    Raises FileNotFoundError when it moved on."""
    try:
        command = read_command(path)
        error, unreadable = None, False
    except MalformedControlFile as exc:
        command, unreadable = None, isinstance(exc, UnreadableControlFile)
        error = safe_name(str(exc))
    try:
        mtime = os.stat(path).st_mtime
    except OSError:
        mtime = 0.0
    return _Known(location, command, error, mtime, unreadable)
