"""Each rank's liveness as one fixed-size record, rewritten in place: a pulse that does not
grow the log.

    RUN_DIR/pulses/A{attempt:04d}.R{rank:04d}.json   one record, RECORD_BYTES long

A rank's pulse is about *now*: that it is alive, at which step, since when. Appended to the
event log once a second by every rank, it made the log grow with ranks × seconds (a 1,024-rank
day is 88 million lines), and every reader that opens the run replays them all. So every
pulse goes to this record instead, overwritten at offset 0 (the file never grows), and only
one pulse a minute still goes to the log (:data:`LOG_EVERY_S`), so the log grows with events.

The record is one JSON object padded with spaces to ``RECORD_BYTES - 1`` bytes and a newline::

    {"v":1,"run":"…","attempt":0,"rank":3,"host":"n1","pid":4242,"t":1764430000.5,
     "step":120,"since":1764429990.1,"seq":17,"crc":"9a3e0c1f"}

``t`` is when the rank last pulsed, ``step`` its step then (``null`` before its first step),
``since`` when it first reached that step (so a reader that opens the run late still sees for
how long a hung rank has stood still), ``seq`` counts the rewrites. ``crc`` is the CRC-32 of
the object written without its ``crc`` member: a rewrite is not atomic for a reader on every
filesystem, and a torn read then fails the check and is read again at the next poll.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ckptdash.rundir import door

PULSES_DIR: Final = "pulses"
RECORD_BYTES: Final = 512
"""Every record is exactly this long, so a rewrite never changes the file's size."""
FORMAT_VERSION: Final = 1
LOG_EVERY_S: Final = 60.0
"""How often a rank still appends a ``pulse`` to the event log, for the history (the
progress series, a reader of the log alone); the record holds the one of every second."""
TORN: Final = "torn: not one whole record (a rewrite in progress, or not a pulse record)"
"""What :func:`decode` says of bytes that are not one whole record; read them again later."""
_CRC: Final = b',"crc":"'
NAME_RE: Final = re.compile(r"^A(\d{4,9})\.([RN])(\d{4,9})\.json$")
"""``A….R{rank}.json``: one rank's record; ``A….N{rank}.json``: a node's file, the records of
every rank of the node, one after another, written by its local rank 0 (``{rank}``)."""
NODE_RECORDS_MAX: Final = 1024
"""A node file holds at most this many records (a reader reads no more)."""
_HOST_MAX: Final = 200


def record_name(attempt: int, rank: int) -> str:
    """The record file's name of one rank of one attempt."""
    return f"A{attempt:04d}.R{rank:04d}.json"


def node_file_name(attempt: int, collector_rank: int) -> str:
    """The name of a node's file of records, written by its local rank 0."""
    return f"A{attempt:04d}.N{collector_rank:04d}.json"


@dataclass(frozen=True, slots=True)
class PulseRecord:
    """One rank's liveness as its record says it."""

    run: str
    attempt: int
    rank: int
    host: str
    pid: int
    t: float
    step: int | None
    since: float
    seq: int


def encode(rec: PulseRecord) -> bytes:
    """The record's bytes: RECORD_BYTES long, newline-terminated, with its CRC."""
    body: dict[str, Any] = {
        "v": FORMAT_VERSION,
        "run": rec.run,
        "attempt": rec.attempt,
        "rank": rec.rank,
        "host": rec.host[:_HOST_MAX],
        "pid": rec.pid,
        "t": rec.t,
        "step": rec.step,
        "since": rec.since,
        "seq": rec.seq,
    }
    raw = json.dumps(body, separators=(",", ":"))
    crc = f"{zlib.crc32(raw.encode()):08x}"
    data = (raw[:-1] + f',"crc":"{crc}"' + "}").encode()
    if len(data) > RECORD_BYTES - 1:
        raise ValueError(f"a pulse record of {len(data)} bytes does not fit {RECORD_BYTES}")
    return data.ljust(RECORD_BYTES - 1) + b"\n"


def decode(data: bytes) -> PulseRecord | str:
    """The record in ``data``, or why it is not one (torn, another version, a bad field)."""
    text = data.rstrip(b" \n")
    cut = text.rfind(_CRC)
    if cut < 0 or not text.endswith(b'"}') or len(text) != cut + len(_CRC) + 10:
        return TORN
    head = text[:cut] + b"}"  # the object as written, without its crc member
    if text[cut + len(_CRC) : -2] != b"%08x" % zlib.crc32(head):
        return TORN
    try:
        obj = json.loads(head)
    except (ValueError, RecursionError):
        return TORN
    if not isinstance(obj, dict):
        return "not a JSON object"
    if obj.get("v") != FORMAT_VERSION:
        return f"format version {obj.get('v')!r}, not {FORMAT_VERSION}"
    try:
        rec = PulseRecord(
            run=_typed(obj, "run", str),
            attempt=_count(obj, "attempt"),
            rank=_count(obj, "rank"),
            host=_typed(obj, "host", str),
            pid=_count(obj, "pid"),
            t=_time(obj, "t"),
            step=None if obj.get("step") is None else _count(obj, "step"),
            since=_time(obj, "since"),
            seq=_count(obj, "seq"),
        )
    except ValueError as exc:
        return str(exc)
    return rec


def _typed(obj: dict[str, Any], key: str, kind: type[str]) -> str:
    value = obj.get(key)
    if not isinstance(value, kind):
        raise ValueError(f"{key} is {value!r}, not a string")
    return value


def _count(obj: dict[str, Any], key: str) -> int:
    value = obj.get(key)
    if type(value) is not int or not 0 <= value < 2**63:
        raise ValueError(f"{key} is {value!r}, not a whole number ≥ 0")
    return value


def _time(obj: dict[str, Any], key: str) -> float:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e11:
        raise ValueError(f"{key} is {value!r}, not a time in seconds since the epoch")
    return float(value)


class RecordMaker:
    """The next record of one rank, each with the next ``seq``."""

    def __init__(self, *, run: str, attempt: int, rank: int, host: str) -> None:
        self._last = PulseRecord(run, attempt, rank, host, os.getpid(), 0.0, None, 0.0, 0)

    def next(self, *, t: float, step: int | None, since: float) -> bytes:
        """The record saying: alive at ``t``, at ``step`` since ``since``."""
        b = self._last
        self._last = PulseRecord(b.run, b.attempt, b.rank, b.host, b.pid, t, step, since, b.seq + 1)
        return encode(self._last)


class RecordFile:
    """A file rewritten in place with one ``pwrite`` at offset 0, opened through the run's one
    door (:func:`ckptdash.rundir.door.open_at`): relative to its folder, itself never entered
    through a link (a ``pulses/`` swapped for a link to the owner's home is refused), never
    blocking (a FIFO in its place is refused, not waited on), and only this user's own regular
    file with one link. Raises ``OSError`` naming the file otherwise."""

    def __init__(self, path: str | os.PathLike[str], mode: int = 0o644) -> None:
        self.path = Path(path)
        with door.folder(self.path.parent, create=True) as held:
            self._fd: int | None = door.open_at(
                held, self.path.name, write=True, create=True, mode=mode, own=True, path=path
            )[0]
        self._size = 0

    def write(self, data: bytes) -> None:
        """Rewrite the file with ``data`` (cut back where it held more before)."""
        if self._fd is None:
            raise ValueError(f"{self.path}: the pulse record writer is closed")
        if os.pwrite(self._fd, data, 0) != len(data):
            raise OSError(f"{self.path}: a short write of the pulse record")
        if len(data) < self._size:
            os.ftruncate(self._fd, len(data))
        self._size = len(data)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def pulses_folder(root: str | os.PathLike[str]) -> Path:
    """``RUN/pulses`` (made by the first :class:`RecordFile` in it, mode 0755)."""
    return Path(root) / PULSES_DIR


class PulseRecordWriter:
    """Rewrites one rank's own record in ``pulses/`` in place."""

    def __init__(self, root: str | os.PathLike[str], *, run: str, attempt: int, rank: int,
                 host: str) -> None:  # fmt: skip
        self._file = RecordFile(pulses_folder(root) / record_name(attempt, rank))
        self.path = self._file.path
        self._maker = RecordMaker(run=run, attempt=attempt, rank=rank, host=host)

    def write(self, *, t: float, step: int | None, since: float) -> None:
        """Rewrite the record: alive at ``t``, at ``step`` since ``since``."""
        self._file.write(self._maker.next(t=t, step=step, since=since))

    def close(self) -> None:
        self._file.close()
