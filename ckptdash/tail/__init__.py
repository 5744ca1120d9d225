"""The incremental reader: what is new in a run directory since the last look.

:class:`RunTailer` keeps a byte offset per event file and reads only the bytes
appended since the last :meth:`~RunTailer.poll`, up to the last newline: a
half-written last line is never parsed; it is read again, whole, once its
newline arrives. It also lists ``control/inbox|claimed|done`` and reports each
command file when it first appears and whenever it moves. The runs below a folder are each
followed by one, in the run set (:mod:`ckptdash.state.runset`).

Nothing here raises on bad input: a line that does not decode comes back as a
:class:`~ckptdash.events.BadLine`, a file that cannot be read as one too, and a
file that vanishes between listing and opening (a claimer renamed it) is
simply looked for again at the next poll.

Hostile input costs little (docs/security.md): a line over :data:`MAX_LINE_BYTES`
is counted ``oversize`` after one search for its end, never read again; a
checkpoint record counts only from a file of this run whose name and first line
agree with it; event files idle for :data:`COLD_AFTER` polls are looked at once
every :data:`COLD_EVERY` polls.

>>> tailer = RunTailer("runs/exp1")          # doctest: +SKIP
>>> for batch in tailer.batches():           # doctest: +SKIP
...     state.apply(batch)                   # a big log, in cache-sized pieces
>>> state.apply(tailer.poll())               # doctest: +SKIP
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import compress
from pathlib import Path
from typing import BinaryIO, Final, cast

from ckptdash.errors import RunDirError
from ckptdash.events import (
    BadLine,
    Event,
    decode_lines,
)
from ckptdash.rundir import EVENT_SUFFIX, RunDir, is_temp_file
from ckptdash.rundir.safe_read import open_regular
from ckptdash.tail.batch import LOCATIONS, CommandFile, Location, Position, TailBatch
from ckptdash.tail.commands import CommandFolders
from ckptdash.tail.pulses import PulseRecords
from ckptdash.tail.vouch import VOUCHED, decode_vouched, disagreement, first_run_id, foreign

# The records a poll returns live in tail/batch.py, the command folders' reader in
# tail/commands.py; this module is the public face, so they are importable from here.
__all__ = [
    "COLD_AFTER",
    "COLD_EVERY",
    "DECODE_BYTES",
    "LOCATIONS",
    "MAX_LINE_BYTES",
    "READ_BYTES",
    "CommandFile",
    "Location",
    "Position",
    "RunTailer",
    "TailBatch",
]

READ_BYTES: Final = 1 << 20
"""Bytes asked of the OS per read of an event file."""

DECODE_BYTES: Final = 256 << 10
"""Bytes decoded per :func:`~ckptdash.events.decode_lines` call.

Small on purpose: the events decoded from one piece then stay in the CPU cache
until the state has consumed them. Measured on a 2-core machine with 2 MiB of
L2, a 1 MiB read cut into 256 KiB pieces loads about 1.5 M events/s (tail and
state); 16 MiB pieces load half as fast.
"""

MAX_LINE_BYTES: Final = 1 << 20
"""A line longer than this (without its newline) is counted as ``oversize`` and skipped unread.

Without a cap one unterminated 200 MB line was read again from its start at every poll. The
tailer now searches for the end of such a line once, remembering how far it looked, and never
holds more than one read of it in memory.
"""

COLD_AFTER: Final = 30
"""Polls in a row that found an event file unchanged before it counts as *cold*."""
COLD_EVERY: Final = 16
"""A cold file is looked at (one ``stat``) every this many polls, or when the caller says it
changed (:meth:`RunTailer.touch`: the follower does, from inotify). A folder of 100,000 idle
event files then costs an idle follower a few percent of a core instead of a third of one."""
_LISTING_SETTLED_S: Final = 2.0
"""An ``events/`` folder whose last change is this much older than our listing has the
listing reused until it changes again; a more recent change may share its timestamp with a
file created after we listed, so that listing is not trusted."""


@dataclass(slots=True)
class _Cursor:
    """How far one event file has been read."""

    offset: int = 0
    lineno: int = 1  # number of the next line to decode
    ino: int | None = None
    scanned: int = 0  # bytes after offset searched for a newline: an oversize line being skipped
    idle: int = 0  # checks in a row that found the file unchanged
    first: str | None = None  # "" when line 1 agrees with the name and run.json, else why not


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
        self.looked_at = 0
        """Event files the last poll looked at (one ``stat`` each): cold files are skipped."""
        self.reports = 0
        """Unreadable files or folders, and bad pulse records, reported so far (each also
        handed out as a bad line; a reader that starts afresh reports them again)."""
        self._read_bytes = max(1, read_bytes)
        self._decode_bytes = max(1, decode_bytes)
        self._cursors: dict[str, _Cursor] = {}
        self._sizes: dict[str, int] = {}
        self._command_files = CommandFolders(self.run_dir)
        self._pulse_records = PulseRecords(str(self.run_dir.root))
        self._budget = -1  # bytes the running poll may still decode; -1: no limit
        self._poll_number = 0  # a generator of an older poll stops instead of re-reading
        self._reported: set[tuple[str, str]] = set()
        self._run_id: str | None = None  # from run.json, once it exists
        self._listing: tuple[object, list[str]] | None = None
        self._touched: set[str] = set()
        self._events_dir = str(self.run_dir.events)
        # Cold files are split into COLD_EVERY fixed groups; a poll looks at the hot files and
        # one group. Rebuilt when the listing or the set of cold files changes.
        self._cold: set[str] = set()
        self._schedule: tuple[list[str], list[str], list[list[str]]] | None = None

    def touch(self, names: Iterable[str]) -> None:
        """Look at these event files (names or paths) at the next poll even if they are cold."""
        self._touched.update(os.path.basename(n) for n in names)

    @property
    def root(self) -> Path:
        return self.run_dir.root

    @property
    def _expected_run(self) -> str:
        """The run id checkpoint records must carry (the folder's name until one is known)."""
        return self._run_id if self._run_id is not None else self.run_dir.root.name

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

    def positions(self) -> dict[str, Position]:
        """Where each event file read so far stands (the next byte and line to read), by name:
        what a snapshot records (:mod:`ckptdash.state.snapshot`)."""
        return {
            name: Position(cur.offset, cur.lineno, cur.ino or 0, cur.scanned, cur.first)
            for name, cur in sorted(self._cursors.items())
            if cur.ino is not None
        }

    def resume(self, positions: dict[str, Position], run_id: str | None) -> None:
        """Continue from ``positions`` (checked by the caller against the files on disk) as if
        this tailer had read up to them itself; ``run_id`` is the one it had found."""
        for name, p in positions.items():
            self._cursors[name] = _Cursor(p.offset, p.lineno, p.ino, p.scanned, 0, p.first)
        self._run_id = run_id

    @property
    def run_id(self) -> str | None:
        """The run id checkpoint records must carry, once the tailer has found it."""
        return self._run_id

    # --- internals ---------------------------------------------------------------------------

    def _pieces(self, max_bytes: int | None) -> Iterator[TailBatch]:
        self.caught_up = True
        self._budget = -1 if max_bytes is None else max(0, max_bytes)
        self._poll_number += 1
        number = self._poll_number
        commands = self._command_files.poll(self._report, self._reported)
        if commands:
            yield commands
        names, trouble = self._event_file_names()
        if trouble:
            yield trouble
        if names and self._run_id is None and (problem := self._read_run_id(names)):
            yield problem
        pulses, bad = self._pulse_records.poll(self._run_id or "")
        if pulses or bad:  # every rank's liveness now, from its record (rundir/pulses)
            self.reports += len(bad)
            yield TailBatch(bad=bad, pulses=pulses)
        touched, self._touched = self._touched, set()
        self.looked_at = 0
        for name in self._due(names, number, touched):
            if self._budget == 0:
                self.caught_up = False
                return
            yield from self._read_file(name, number)

    def _due(self, names: list[str], number: int, touched: set[str]) -> list[str]:
        """The files to look at in this poll: every hot one, one group of the cold ones, and
        the cold ones the caller said changed; in name order."""
        if not self._cold:
            return names
        sched = self._schedule
        if sched is None or sched[0] is not names:
            cold = [n for n in names if n in self._cold]
            hot = [n for n in names if n not in self._cold]
            groups = [cold[i::COLD_EVERY] for i in range(COLD_EVERY)]
            sched = self._schedule = (names, hot, groups)
        _, hot, groups = sched
        due = [*hot, *groups[number % COLD_EVERY]]
        due += (n for n in touched if n in self._cold and n not in due)
        return sorted(due)

    def _read_run_id(self, names: list[str]) -> TailBatch:
        """The run id that checkpoint records must carry: run.json's; for a log written
        without one (by another tool), the id on the first line of the first attempt's rank-0
        file, as :class:`~ckptdash.state.RunState` names such a run."""
        try:
            if not self.run_dir.run_file.exists():
                self._run_id = first_run_id(self._events_dir, names, MAX_LINE_BYTES)
                return TailBatch()
            self._run_id = self.run_dir.info().run_id
        except RunDirError as exc:
            return self._report("run.json", "read the run id", OSError(str(exc)))
        except OSError as exc:
            return self._report("run.json", "read the run id", exc)
        return TailBatch()

    def _report(self, file: str, problem: str, exc: OSError) -> TailBatch:
        """A bad line for an unreadable file or folder, once per (file, problem) until it heals."""
        if (file, problem) in self._reported:
            return TailBatch()
        self._reported.add((file, problem))
        self.reports += 1
        detail = f"cannot {problem} ({exc.strerror or exc}); check its permissions"
        return TailBatch(bad=[BadLine(file, 0, "invalid", detail)])

    def _event_file_names(self) -> tuple[list[str], TailBatch]:
        try:
            st = os.stat(self.run_dir.events)
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
            if self._listing is not None and self._listing[0] == key:
                return self._listing[1], TailBatch()
            names = os.listdir(self.run_dir.events)
        except FileNotFoundError:
            return [], TailBatch()
        except OSError as exc:
            return [], self._report("events/", "list the folder", exc)
        self._reported.discard(("events/", "list the folder"))
        names = sorted(n for n in names if n.endswith(EVENT_SUFFIX) and not is_temp_file(n))
        # Reuse this listing until the folder changes, once its last change is long past.
        settled = time.time() - st.st_mtime > _LISTING_SETTLED_S
        self._listing = (key, names) if settled else None
        return names, TailBatch()

    def _read_file(self, name: str, number: int) -> Iterator[TailBatch]:
        """Decode the complete lines appended to ``name`` since the last read, piece by piece."""
        path = os.path.join(self._events_dir, name)  # a str: pathlib costs more than stat
        cur = self._cursors.get(name)
        if cur is None:
            cur = self._cursors[name] = _Cursor()
        self.looked_at += 1
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
            cur.offset, cur.lineno, cur.scanned, cur.first = 0, 1, 0, None
            yield TailBatch(bad=[BadLine(name, 0, "invalid", detail)])
        cur.ino = st.st_ino
        if self._sizes.get(name) == st.st_size:
            cur.idle += 1
            if cur.idle == COLD_AFTER:
                self._cold.add(name)
                self._schedule = None
        else:
            cur.idle = 0
            if name in self._cold:
                self._cold.discard(name)
                self._schedule = None
        size = self._sizes[name] = st.st_size
        if size == cur.offset + cur.scanned:
            return
        try:
            # Held across the yields below. A regular file only: a FIFO (whose size reads 0
            # until someone writes to it) or a device is reported, never blocked on.
            f = os.fdopen(open_regular(path)[0], "rb")
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
                if cur.scanned:
                    if not self._skip_oversize(f, name, cur, size):
                        return  # its newline has not come yet; searched up to here
                    yield TailBatch(bad=[self._oversize_line(name, cur)])
                    continue
                f.seek(cur.offset)
                block = f.read(min(self._read_bytes, size - cur.offset))
                cut = block.rfind(b"\n") + 1
                # A line longer than a read: read on, but never past the cap.
                left = size - cur.offset
                while cut == 0 and 0 < len(block) <= MAX_LINE_BYTES and len(block) < left:
                    more = f.read(min(self._read_bytes, size - cur.offset - len(block)))
                    if not more:
                        break
                    block += more
                    cut = block.rfind(b"\n") + 1
                if cut == 0:
                    if len(block) > MAX_LINE_BYTES:
                        cur.scanned = len(block)  # skip it, remembering how far we looked
                        continue
                    return  # only the start of a line so far: it waits for its newline
                start = 0
                long = _long_line(block, 0, cut) if cut > MAX_LINE_BYTES else None
                while start < cut:
                    if number != self._poll_number:
                        return  # a newer poll moved the cursor: this block is stale
                    if self._budget == 0:
                        self.caught_up = False
                        return
                    if long is not None and long[0] == start:
                        cur.scanned = long[1] - 1 - start  # its newline is at long[1] - 1
                        yield TailBatch(bad=[self._oversize_line(name, cur)])
                        start = long[1]
                        long = _long_line(block, start, cut)
                        continue
                    end = self._piece_end(block, start, cut if long is None else long[0])
                    yield self._decode(block[start:end], name, cur)
                    if self._budget > 0:
                        self._budget = max(0, self._budget - (end - start))
                    start = end

    def _skip_oversize(self, f: BinaryIO, name: str, cur: _Cursor, size: int) -> bool:
        """Search on for the newline that ends an oversize line, from where the last search
        stopped. True when found: ``cur.scanned`` is then the line's length (the newline is at
        ``cur.offset + cur.scanned``); False when the line goes on to the end of the file."""
        pos = cur.offset + cur.scanned
        f.seek(pos)
        while pos < size:
            chunk = f.read(min(self._read_bytes, size - pos))
            if not chunk:
                break
            i = chunk.find(b"\n")
            if i >= 0:
                cur.scanned = pos + i - cur.offset  # the line's length, without its newline
                return True
            pos += len(chunk)
        cur.scanned = pos - cur.offset
        return False

    def _oversize_line(self, name: str, cur: _Cursor) -> BadLine:
        """Count the oversize line that ends at ``cur.offset + cur.scanned`` and step past it."""
        length = cur.scanned
        if cur.lineno == 1:
            cur.first = "its first line is oversize"
        bad = BadLine(
            name,
            cur.lineno,
            "oversize",
            f"{length} bytes, longer than a line may be ({MAX_LINE_BYTES}); skipped unread",
        )
        cur.offset += length + 1
        cur.lineno += 1
        cur.scanned = 0
        return bad

    def _piece_end(self, block: bytes, start: int, cut: int) -> int:
        """End of the next piece to decode: whole lines, about ``decode_bytes`` long."""
        if cut - start <= self._decode_bytes:
            return cut
        end = block.rfind(b"\n", start, start + self._decode_bytes) + 1
        if end <= start:  # a single line longer than a piece
            end = block.find(b"\n", start + self._decode_bytes, cut) + 1
        return end

    def _decode(self, piece: bytes, name: str, cur: _Cursor) -> TailBatch:
        first_lineno = cur.lineno
        records = decode_lines(piece, file=name, first_lineno=first_lineno)
        cur.lineno += piece.count(b"\n")
        cur.offset += len(piece)
        if cur.first is None and records:
            cur.first = disagreement(name, records[0], self._expected_run)
        # One C-speed pass over the types; the slower paths only for a bad line or a record
        # that decides what a checkpoint is (rare: a few per thousand lines).
        types = set(map(type, records))
        if not types.isdisjoint(VOUCHED) and any(
            foreign(name, cur.first, r, self._expected_run)  # type: ignore[arg-type]  # events
            for r in compress(records, map(VOUCHED.__contains__, map(type, records)))
        ):
            return decode_vouched(piece, name, cur.first, first_lineno, self._expected_run)
        if BadLine not in types:
            return TailBatch(events=cast("list[Event]", records))
        batch = TailBatch()
        for r in records:
            if isinstance(r, BadLine):
                batch.bad.append(r)
            else:
                batch.events.append(r)
        return batch


def _long_line(block: bytes, start: int, cut: int) -> tuple[int, int] | None:
    """The first line of ``block[start:cut]`` (whole lines) longer than MAX_LINE_BYTES, as
    (its start, the end of its newline), or None. Jumps a cap's width at a time, so a block
    of short lines costs a few ``rfind`` calls, not one per line."""
    pos = start
    while cut - pos > MAX_LINE_BYTES:
        nl = block.rfind(b"\n", pos, pos + MAX_LINE_BYTES + 1)
        if nl < 0:
            return pos, block.find(b"\n", pos) + 1
        pos = nl + 1
    return None
