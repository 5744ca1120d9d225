"""Which checkpoint records count: only those from a file of this run that vouches for them.

A record that decides what a checkpoint is (:data:`VOUCHED`) counts only from a file of
this run whose name, first line and the record itself agree on run, attempt and rank (see
docs/format.md); any other is reported as an ``invalid`` line saying why. Used by
:class:`~ckptdash.tail.RunTailer` on every piece it decodes.
"""

from __future__ import annotations

import os
import re
from typing import Final

from ckptdash.events import CHECKPOINT_EVENTS, BadLine, Event, RunResumed, decode_line
from ckptdash.rundir.safe_read import open_regular
from ckptdash.tail.batch import TailBatch

VOUCHED: Final = frozenset({*CHECKPOINT_EVENTS, RunResumed})
_NAME_RE: Final = re.compile(r"^A(\d{4,})\.R(\d{4,})\.")


def first_run_id(events_dir: str, names: list[str], max_line: int) -> str | None:
    """The run id on the first line of the first attempt's rank-0 file, for a log written
    without run.json (by another tool); None when there is none to read."""
    for name in names:
        m = _NAME_RE.match(name)
        if m is None or int(m.group(2)) != 0:
            continue
        try:
            fd, _st = open_regular(os.path.join(events_dir, name))  # never blocks on a FIFO
            with os.fdopen(fd, "rb") as f:
                first = f.readline(max_line + 1)
        except OSError:
            return None
        record = decode_line(first) if first.endswith(b"\n") else None
        return record.run if isinstance(record, Event) else None
    return None


def disagreement(name: str, record: Event | BadLine, run_id: str) -> str:
    """Why the file's first line does not vouch for the file ("" when it does)."""
    if isinstance(record, BadLine):
        return f"its first line is not a valid event ({record.reason})"
    return _mismatch(name, record, run_id)


def _mismatch(name: str, ev: Event, run_id: str) -> str:
    m = _NAME_RE.match(name)
    if m is None:
        return "its file is not named A<attempt>.R<rank>.…jsonl"
    if ev.run != run_id:
        return f"run {ev.run!r} is not this run ({run_id!r} in run.json)"
    if (ev.attempt, ev.rank) != (int(m.group(1)), int(m.group(2))):
        return (
            f"attempt {ev.attempt} rank {ev.rank} in a file named for attempt"
            f" {int(m.group(1))} rank {int(m.group(2))}"
        )
    return ""


def foreign(name: str, first: str | None, ev: Event, run_id: str) -> str:
    """Why a checkpoint record does not belong to this run ("" when it does); ``first`` is
    what :func:`disagreement` said of the file's first line."""
    why = _mismatch(name, ev, run_id)
    if not why and first:
        why = f"its file does not belong to this run: {first}"
    return why


def decode_vouched(
    piece: bytes, name: str, first: str | None, lineno: int, run_id: str
) -> TailBatch:
    """Decode ``piece`` line by line, reporting each foreign checkpoint record as invalid."""
    batch = TailBatch()
    for offset, line in enumerate(piece.split(b"\n")):
        if not line.strip():
            continue
        r = decode_line(line, name, lineno + offset)
        if isinstance(r, BadLine):
            batch.bad.append(r)
        elif type(r) in VOUCHED and (why := foreign(name, first, r, run_id)):
            detail = f"{r.KIND} not counted: {why}"
            batch.bad.append(BadLine(name, lineno + offset, "invalid", detail))
        else:
            batch.events.append(r)
    return batch
