"""The event writer: one append-only JSONL file per attempt and writing process.

Each line is written with a single ``write`` of the whole encoded line on a
file opened with ``O_APPEND``, so a crash leaves at most one torn *last* line,
which readers ignore until (never) its newline arrives. The file is created
with ``O_EXCL``: two processes can never share one.

Events in :data:`ckptdash.events.DURABLE_KINDS` are fsync'ed before
:meth:`EventWriter.write` returns — the action they describe counts as done
only then. Heartbeats and other chatter are flushed to the OS but not
fsync'ed, which keeps them cheap.

A write that fails (disk full, quota, I/O error) raises
:class:`~ckptdash.errors.EventWriteError` naming the file and the cause, and
never leaves half a line in the middle of the log: a partial write is cut
back to the end of the previous line (or, if even that fails, the next event
starts on a fresh line, so only the fragment reads as one corrupt line).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

from ckptdash.errors import EventWriteError, RunDirError
from ckptdash.events import DURABLE_KINDS, EMPTY_METRICS, Event, Heartbeat, encode, encode_metrics
from ckptdash.rundir import EVENT_SUFFIX, RunDir


class EventWriter:
    """Append events for one (attempt, rank) of a run. Thread-safe; a context manager.

    >>> from ckptdash.events import RunStarted
    >>> with EventWriter("runs/exp2", attempt=0) as w:
    ...     _ = w.emit(RunStarted, scheduler="local")
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str] | RunDir,
        *,
        attempt: int,
        rank: int = 0,
        host: str | None = None,
    ) -> None:
        self.run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
        self.host = host or socket.gethostname()
        self.attempt = attempt
        self.rank = rank
        try:
            self.run_id = self.run_dir.ensure().run_id
        except OSError as exc:  # permissions, a read-only filesystem, a full disk
            raise RunDirError(
                f"{self.run_dir.root}: cannot set up the run directory ({exc.strerror});"
                " pick a run_dir you can write to"
            ) from None
        self.path, fd = self._create()
        self._lock = threading.Lock()
        self._fd: int | None = fd
        self._size = 0  # bytes of whole lines in our file (we are its only writer)
        self._torn = False  # a failed write left a fragment we could not cut back

    def _create(self) -> tuple[Path, int]:
        # O_EXCL guarantees a single writer per file; a second writer of the same attempt
        # in this process (a second fit()) gets the next free suffix.
        base = self.run_dir.event_file_name(self.attempt, self.rank, self.host)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
        for n in range(1000):
            name = base if n == 0 else base.replace(EVENT_SUFFIX, f"-{n}{EVENT_SUFFIX}")
            path = self.run_dir.events / name
            try:
                return path, os.open(path, flags, 0o644)
            except FileExistsError:
                continue
            except OSError as exc:
                raise RunDirError(
                    f"{path}: cannot create the event file ({exc.strerror}); the training side"
                    f" must be able to write to {self.run_dir.events}: pick a run_dir you can"
                    " write to, or fix its permissions"
                ) from None
        raise RunDirError(f"{self.run_dir.events}: 1000 event files named {base}; clean up the run")

    def write(self, event: Event) -> None:
        """Validate and append ``event``; fsync it if its kind is durable.

        Raises :class:`~ckptdash.errors.EventValidationError` before anything is
        written if the event breaks the schema.
        """
        line = encode(event)
        with self._lock:
            if self._fd is None:
                raise ValueError(f"{self.path}: the event writer is closed")
            data = b"\n" + line if self._torn else line
            try:
                _write_all(self._fd, data)
            except OSError as exc:
                self._cut_back()
                raise EventWriteError(
                    exc.errno,
                    f"cannot write a {event.KIND} event ({exc.strerror}); the log is intact up"
                    f" to the previous event. Free space on, or fix the permissions of,"
                    f" {self.path.parent}: until then nothing this job does is recorded",
                    str(self.path),
                ) from exc
            if self._torn:  # the fragment before our newline counts too
                self._size, self._torn = os.fstat(self._fd).st_size, False
            else:
                self._size += len(data)
            if event.KIND in DURABLE_KINDS:
                try:
                    os.fsync(self._fd)
                except OSError as exc:
                    raise EventWriteError(
                        exc.errno,
                        f"a {event.KIND} event was written but could not be made durable"
                        f" ({exc.strerror}); check the filesystem of {self.path.parent}",
                        str(self.path),
                    ) from exc

    def _cut_back(self) -> None:
        """Remove the fragment a failed write may have left after the last whole line."""
        assert self._fd is not None
        try:
            if os.fstat(self._fd).st_size != self._size:
                os.ftruncate(self._fd, self._size)
        except OSError:
            self._torn = True  # the next line starts with a newline: the fragment stands alone

    def emit(self, kind: type[Event], *, step: int | None = None, **fields: Any) -> Event:
        """Build an event of ``kind`` with this writer's envelope, write it and return it."""
        if kind is Heartbeat and not isinstance(fields.get("metrics", EMPTY_METRICS), msgspec.Raw):
            fields["metrics"] = encode_metrics(fields["metrics"])
        event = kind(
            t=fields.pop("t", None) or time.time(),
            run=self.run_id,
            attempt=self.attempt,
            rank=self.rank,
            host=self.host,
            step=step,
            **fields,
        )
        self.write(event)
        return event

    def sync(self) -> None:
        """Fsync everything written so far (the writer stays open)."""
        with self._lock:
            if self._fd is not None:
                os.fsync(self._fd)

    def close(self) -> None:
        """Fsync and close the file; later writes raise."""
        with self._lock:
            if self._fd is not None:
                try:
                    os.fsync(self._fd)
                finally:
                    os.close(self._fd)
                    self._fd = None

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write_all(fd: int, data: bytes) -> None:
    # One write() of a whole line is the normal case; loop only for short writes
    # (signals, full pipes) so a line is never left half-written by us.
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
