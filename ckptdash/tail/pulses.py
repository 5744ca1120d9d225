"""Reading every rank's pulse record (:mod:`ckptdash.rundir.pulses`) as pulses.

Each poll lists ``pulses/`` once and reads only the records whose file changed since the last
look (inode, size, modification time from the listing's ``stat``): one read per rank that
pulsed, never a growing file. A record becomes two :class:`~ckptdash.events.Pulse` events, one
at ``since`` and one at ``t``, the same two facts a replay of every pulse of the log would
give the state (the earliest time the rank was seen at its step, and its last sign of life).

A record is a run-directory file like any other (anyone in a group folder can write there):
it is read only as a regular file, never through a link, at most ``2 × RECORD_BYTES``; one
whose run, attempt or rank disagrees with its name or the run is reported once as an
``invalid`` line and never counts. A record torn by a rewrite is read again at the next poll.
"""

from __future__ import annotations

import os

from ckptdash.events import BadLine, Pulse
from ckptdash.rundir.pulses import (
    NAME_RE,
    NODE_RECORDS_MAX,
    PULSES_DIR,
    RECORD_BYTES,
    TORN,
    decode,
)
from ckptdash.rundir.safe_read import read_capped

_Key = tuple[int, int, int]


class PulseRecords:
    """The pulse records of one run directory, read as they change."""

    def __init__(self, root: str) -> None:
        self.folder = os.path.join(root, PULSES_DIR)
        self._seen: dict[str, _Key] = {}
        self._seq: dict[tuple[str, int], int] = {}  # (file, rank) -> the seq last applied
        self._told: dict[str, str] = {}  # name -> the reason last reported for it
        self._torn: dict[str, _Key] = {}  # name -> the file as it was when read torn

    def poll(self, run_id: str) -> tuple[list[Pulse], list[BadLine]]:
        """The pulses of the records that changed since the last poll, and bad records."""
        pulses: list[Pulse] = []
        bad: list[BadLine] = []
        try:
            entries = list(os.scandir(self.folder))
        except OSError:  # no pulses/ yet (or a writer of an older ckptdash)
            return pulses, bad
        for entry in entries:
            m = NAME_RE.match(entry.name)
            if m is None:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            if self._seen.get(entry.name) == key:
                continue
            node = m[2] == "N"
            problem, pulse_pair = self._read(entry.name, int(m[1]), int(m[3]), node, run_id)
            if problem == TORN and self._torn.get(entry.name) != key:
                self._torn[entry.name] = key  # a rewrite in progress: read it again next poll
                continue
            self._torn.pop(entry.name, None)  # torn twice unchanged: it is not a record
            self._seen[entry.name] = key
            if problem:
                if self._told.get(entry.name) != problem:
                    self._told[entry.name] = problem
                    bad.append(BadLine(entry.path, 1, "invalid", problem))
                continue
            self._told.pop(entry.name, None)
            pulses.extend(pulse_pair)
        return pulses, bad

    def _read(
        self, name: str, attempt: int, rank: int, node: bool, run_id: str
    ) -> tuple[str, list[Pulse]]:
        """The pulses of one file (a rank's record, or a node's records one after another):
        ``""`` and the pulses, or why it does not count (:data:`TORN`: read it again)."""
        path = os.path.join(self.folder, name)
        try:
            data = read_capped(path, (NODE_RECORDS_MAX if node else 2) * RECORD_BYTES)
        except OSError as exc:
            return f"not read: {exc.strerror or exc}", []
        chunks = [data[i : i + RECORD_BYTES] for i in range(0, len(data), RECORD_BYTES)]
        if not node and len(chunks) > 1:
            chunks = [data]  # one record: the bytes past it make it torn, not a second record
        out: list[Pulse] = []
        torn = False
        for chunk in chunks or [b""]:
            rec = decode(chunk)
            if rec == TORN:
                torn = True
                continue
            if isinstance(rec, str):
                return rec, []
            if rec.attempt != attempt or (not node and rec.rank != rank):
                return f"says attempt {rec.attempt} rank {rec.rank}, its name another", []
            if run_id and rec.run != run_id:
                return f"is of run {rec.run!r}, not of this run ({run_id!r})", []
            if self._seq.get((name, rec.rank)) == rec.seq:
                continue
            self._seq[(name, rec.rank)] = rec.seq
            out += [
                Pulse(
                    t=t, run=rec.run, attempt=attempt, rank=rec.rank, host=rec.host, step=rec.step
                )
                for t in (rec.since, rec.t)
            ]
        if torn and not out:
            return TORN, []
        return "", out
