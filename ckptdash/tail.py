"""The incremental reader: what is new in a run directory since the last look.

:class:`RunTailer` keeps a byte offset per event file and reads only the bytes
appended since the last :meth:`~RunTailer.poll`, up to the last newline: a
half-written last line is never parsed; it is read again, whole, once its
newline arrives. It also lists ``control/inbox|claimed|done`` and reports each
command file when it first appears and whenever it moves. :class:`FolderTailer`
does the same for every run below a folder.

Nothing here raises on bad input: a line that does not decode comes back as a
:class:`~ckptdash.events.BadLine`, a file that cannot be read as one too, and a
file that vanishes between listing and opening (a claimer renamed it) is
simply looked for again at the next poll.

>>> tailer = RunTailer("runs/exp1")          # doctest: +SKIP
>>> for batch in tailer.batches():           # a big log, in cache-sized pieces
...     state.apply(batch)
>>> state.apply(tailer.poll())               # later: only what is new
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal, TypeAlias, cast

from ckptdash.control import COMMAND_SUFFIX, is_not_a_command, read_command
from ckptdash.errors import MalformedControlFile, RunDirError, UnreadableControlFile
from ckptdash.events import BadLine, Command, Event, decode_lines
from ckptdash.rundir import EVENT_SUFFIX, RunDir, find_runs, is_temp_file

Location: TypeAlias = Literal["inbox", "claimed", "done"]
LOCATIONS: Final[tuple[Location, ...]] = ("inbox", "claimed", "done")
"""Where a command file can be, in the only order it moves."""

READ_BYTES: Final = 1 << 20
"""Bytes asked of the OS per read of an event file."""

DECODE_BYTES: Final = 256 << 10
"""Bytes decoded per :func:`~ckptdash.events.decode_lines` call.

Small on purpose: the events decoded from one piece then stay in the CPU cache
until the state has consumed them. Measured on a 2-core machine with 2 MiB of
L2, a 1 MiB read cut into 256 KiB pieces loads about 1.5 M events/s (tail and
state); 16 MiB pieces load half as fast.
"""


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

    def __len__(self) -> int:
        return len(self.events) + len(self.bad) + len(self.commands)

    def __bool__(self) -> bool:
        return bool(self.events or self.bad or self.commands)

    def extend(self, other: TailBatch) -> None:
        """Append ``other``'s records after this batch's own."""
        self.events.extend(other.events)
        self.bad.extend(other.bad)
        self.commands.extend(other.commands)


@dataclass(slots=True)
class _Cursor:
    """How far one event file has been read."""

    offset: int = 0
    lineno: int = 1  # number of the next line to decode
    ino: int | None = None


@dataclass(slots=True)
class _Known:
    """The last reported state of one command file."""

    location: Location
    command: Command | None
    error: str | None
    mtime: float
    unreadable: bool  # error came from reading, not parsing: read it again when it moves


class RunTailer:
    """Read one run directory incrementally; see the module docstring.

    ``restarts`` counts event files that shrank or were replaced and were
    therefore read again from their start (each restart is also reported as a
    bad line, because events read before may now be read twice).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str] | RunDir,
        *,
        read_bytes: int = READ_BYTES,
        decode_bytes: int = DECODE_BYTES,
    ) -> None:
        self.run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
        self.restarts = 0
        self.caught_up = True
        """False when the last poll stopped at its byte budget (there may be more to read)."""
        self._read_bytes = max(1, read_bytes)
        self._decode_bytes = max(1, decode_bytes)
        self._cursors: dict[str, _Cursor] = {}
        self._sizes: dict[str, int] = {}
        self._commands: dict[str, _Known] = {}
        self._budget = -1  # bytes the running poll may still decode; -1: no limit
        self._poll_number = 0  # a generator of an older poll stops instead of re-reading
        self._reported: set[tuple[str, str]] = set()

    @property
    def root(self) -> Path:
        return self.run_dir.root

    @property
    def pending_bytes(self) -> dict[str, int]:
        """Per event file, bytes seen on disk beyond the last complete line read.

        Non-zero for a file being written, or for the torn last line a killed
        writer left behind (it is never parsed).
        """
        out = {}
        for name, cur in sorted(self._cursors.items()):
            extra = self._sizes.get(name, cur.offset) - cur.offset
            if extra > 0:
                out[name] = extra
        return out

    def poll(self, max_bytes: int | None = None) -> TailBatch:
        """Everything new since the last poll, as one batch.

        With ``max_bytes`` the poll stops reading event files once that many
        bytes were decoded (at a line boundary) and sets ``caught_up`` to False;
        the next poll continues where it stopped.
        """
        out = TailBatch()
        for batch in self._pieces(max_bytes):
            out.extend(batch)
        return out

    def batches(self, max_bytes: int | None = None) -> Iterator[TailBatch]:
        """Everything new since the last poll, in pieces of about ``decode_bytes`` each.

        Apply each piece before asking for the next: the initial load of a big
        log then runs at full speed and holds only one piece in memory.
        Stopping early is safe: the next poll continues after the last piece
        handed out (and an abandoned iterator then stops for good).
        """
        return self._pieces(max_bytes)

    # --- internals ---------------------------------------------------------------------------

    def _pieces(self, max_bytes: int | None) -> Iterator[TailBatch]:
        self.caught_up = True
        self._budget = -1 if max_bytes is None else max(0, max_bytes)
        self._poll_number += 1
        number = self._poll_number
        commands = self._poll_commands()
        if commands:
            yield commands
        names, trouble = self._event_file_names()
        if trouble:
            yield trouble
        for name in names:
            if self._budget == 0:
                self.caught_up = False
                return
            yield from self._read_file(name, number)

    def _report(self, file: str, problem: str, exc: OSError) -> TailBatch:
        """A bad line for an unreadable file or folder, once per (file, problem) until it heals."""
        if (file, problem) in self._reported:
            return TailBatch()
        self._reported.add((file, problem))
        detail = f"cannot {problem} ({exc.strerror or exc}); check its permissions"
        return TailBatch(bad=[BadLine(file, 0, "invalid", detail)])

    def _event_file_names(self) -> tuple[list[str], TailBatch]:
        try:
            names = os.listdir(self.run_dir.events)
        except FileNotFoundError:
            return [], TailBatch()
        except OSError as exc:
            return [], self._report("events/", "list the folder", exc)
        self._reported.discard(("events/", "list the folder"))
        names = sorted(n for n in names if n.endswith(EVENT_SUFFIX) and not is_temp_file(n))
        return names, TailBatch()

    def _read_file(self, name: str, number: int) -> Iterator[TailBatch]:
        """Decode the complete lines appended to ``name`` since the last read, piece by piece."""
        path = self.run_dir.events / name
        cur = self._cursors.get(name)
        if cur is None:
            cur = self._cursors[name] = _Cursor()
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            if trouble := self._report(name, "stat the file", exc):
                yield trouble
            return
        if (cur.ino is not None and st.st_ino != cur.ino) or st.st_size < cur.offset:
            detail = (
                f"file shrank or was replaced ({cur.offset} bytes read, {st.st_size} now);"
                " reading it again from the start, so earlier events may count twice"
            )
            self.restarts += 1
            cur.offset, cur.lineno = 0, 1
            yield TailBatch(bad=[BadLine(name, 0, "invalid", detail)])
        cur.ino = st.st_ino
        size = self._sizes[name] = st.st_size
        if size == cur.offset:
            return
        try:
            f = open(path, "rb")  # noqa: SIM115 - held across the yields below
        except FileNotFoundError:
            return
        except OSError as exc:
            if trouble := self._report(name, "read the file", exc):
                yield trouble
            return
        self._reported.discard((name, "read the file"))
        with f:
            # Read only up to the size seen now, so a fast writer cannot keep one poll going.
            while cur.offset < size:
                f.seek(cur.offset)
                block = f.read(min(self._read_bytes, size - cur.offset))
                cut = block.rfind(b"\n") + 1
                while cut == 0 and 0 < len(block) < size - cur.offset:  # a line longer than a read
                    more = f.read(min(self._read_bytes, size - cur.offset - len(block)))
                    if not more:
                        break
                    block += more
                    cut = block.rfind(b"\n") + 1
                if cut == 0:
                    return  # only the start of a line so far: it waits for its newline
                start = 0
                while start < cut:
                    if number != self._poll_number:
                        return  # a newer poll moved the cursor: this block is stale
                    if self._budget == 0:
                        self.caught_up = False
                        return
                    end = self._piece_end(block, start, cut)
                    yield self._decode(block[start:end], name, cur)
                    if self._budget > 0:
                        self._budget = max(0, self._budget - (end - start))
                    start = end

    def _piece_end(self, block: bytes, start: int, cut: int) -> int:
        """End of the next piece to decode: whole lines, about ``decode_bytes`` long."""
        if cut - start <= self._decode_bytes:
            return cut
        end = block.rfind(b"\n", start, start + self._decode_bytes) + 1
        if end <= start:  # a single line longer than a piece
            end = block.find(b"\n", start + self._decode_bytes, cut) + 1
        return end

    def _decode(self, piece: bytes, name: str, cur: _Cursor) -> TailBatch:
        records = decode_lines(piece, file=name, first_lineno=cur.lineno)
        cur.lineno += piece.count(b"\n")
        cur.offset += len(piece)
        # One C-speed pass over the types; the slower split only when some line was bad.
        if BadLine not in set(map(type, records)):
            return TailBatch(events=cast("list[Event]", records))
        batch = TailBatch()
        for r in records:
            if isinstance(r, BadLine):
                batch.bad.append(r)
            else:
                batch.events.append(r)
        return batch

    # --- command files -----------------------------------------------------------------------

    def _poll_commands(self) -> TailBatch:
        out = TailBatch()
        seen: dict[str, tuple[int, str]] = {}  # id -> (index of the furthest location, name)
        dirs = (self.run_dir.inbox, self.run_dir.claimed, self.run_dir.done)
        for index, directory in enumerate(dirs):
            try:
                names = os.listdir(directory)
            except FileNotFoundError:
                continue
            except OSError as exc:
                out.extend(self._report(f"control/{LOCATIONS[index]}/", "list the folder", exc))
                continue
            self._reported.discard((f"control/{LOCATIONS[index]}/", "list the folder"))
            for name in names:
                if is_not_a_command(name):
                    continue
                # A file moving while we list can show up twice; moves only go forward.
                seen[name.removesuffix(COMMAND_SUFFIX) or name] = (index, name)
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


def _read_command(path: Path, location: Location) -> _Known:
    """Read and parse one command file with the claimer's own checks (so a file shown as
    malformed here is one the training side will answer with ``command_rejected``).
    Raises FileNotFoundError when it moved on."""
    try:
        command = read_command(path)
        error, unreadable = None, False
    except MalformedControlFile as exc:
        command, error, unreadable = None, str(exc), isinstance(exc, UnreadableControlFile)
    try:
        mtime = os.stat(path).st_mtime
    except OSError:
        mtime = 0.0
    return _Known(location, command, error, mtime, unreadable)


class FolderTailer:
    """Tail a run directory or every run directly below a folder; new runs join as they appear.

    Raises :class:`~ckptdash.errors.RunDirError` at construction when ``path``
    holds no run; later polls never raise (a folder may be empty for a moment).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        read_bytes: int = READ_BYTES,
        decode_bytes: int = DECODE_BYTES,
    ) -> None:
        self.path = Path(path)
        self._options = {"read_bytes": read_bytes, "decode_bytes": decode_bytes}
        self.tailers: dict[Path, RunTailer] = {}
        for run in find_runs(self.path):
            self.tailers[run.root] = RunTailer(run, **self._options)

    def poll(self, max_bytes: int | None = None) -> dict[Path, TailBatch]:
        """What is new in each run (keyed by its root, sorted); every known run has a batch."""
        try:
            for run in find_runs(self.path):
                if run.root not in self.tailers:
                    self.tailers[run.root] = RunTailer(run, **self._options)
        except (RunDirError, OSError):
            pass  # a folder that held runs and holds none right now: keep what we have
        return {root: self.tailers[root].poll(max_bytes) for root in sorted(self.tailers)}
