"""The ranks of one node pulse through one shared file, written by the node's local rank 0.

A pulse record per rank (:mod:`ckptdash.rundir.pulses`) is still one write a second per rank
on the shared filesystem: 1,024 ranks are 1,024 metadata-server operations a second, and every
reader's poll stats 1,024 files. Where the launcher says which rank of its node a process is
(``LOCAL_RANK``: torchrun, Accelerate, Lightning; ``SLURM_LOCALID``: srun), the other ranks of
the node write their record into node-local memory (``/dev/shm``, else the temp folder), and the
node's local rank 0 copies every one of them, with its own, into the node's file
``pulses/A{attempt}.N{its rank}.json`` once a second: one shared write per node.

A rank that sees no local rank 0 collecting (its ``collector`` mark in the node folder older
than :data:`COLLECTOR_FRESH_S`: another container's ``/dev/shm``, a launcher without local
ranks, a local rank 0 that died) writes its own shared record as well, so no rank is ever
unseen; a rank that dies stops refreshing its slot, and its record in the node file ages like
any other. The node folder is the job user's (mode 0700, checked by ``lstat``), else unused.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from ckptdash.rundir.pulses import (
    RECORD_BYTES,
    PulseRecordWriter,
    RecordFile,
    RecordMaker,
    decode,
    node_file_name,
    pulses_folder,
    record_name,
)
from ckptdash.rundir.writer import EventWriter

COLLECTOR_FRESH_S: Final = 5.0
"""A member rank writes its own shared record while the collector's mark is older than this."""
_SLOT_RE: Final = re.compile(r"^A(\d{4,9})\.R(\d{4,9})\.json$")
_MARK: Final = "collector"


def local_rank(env: Mapping[str, str] = os.environ) -> int | None:
    """This process's rank on its node, as its launcher says it (None: it does not)."""
    for name in ("LOCAL_RANK", "SLURM_LOCALID"):
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def node_folder(run_id: str, base: Path | None = None) -> Path | None:
    """The node-local folder the ranks of this run on this node share (None: unusable)."""
    if base is None:
        shm = Path("/dev/shm")
        base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    folder = base / f"ckptdash-{os.getuid()}-{run_id}"
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    try:
        st = os.lstat(folder)
    except OSError:
        return None
    # Another user's folder (planted before us), or a link: never written through.
    if not os.path.isdir(folder) or os.path.islink(folder) or st.st_uid != os.getuid():
        return None
    return folder


class NodePulses:
    """This rank's pulse record, written where it costs the shared filesystem least.

    ``local``: the rank's local rank on its node (:func:`local_rank`; None: it writes its own
    shared record); ``node_base``: where the node folder goes (default ``/dev/shm``)."""

    def __init__(
        self,
        writer: EventWriter,
        *,
        local: int | None = None,
        node_base: Path | None = None,
    ) -> None:
        self._writer = writer
        self._maker = RecordMaker(
            run=writer.run_id, attempt=writer.attempt, rank=writer.rank, host=writer.host
        )
        self._folder = node_folder(writer.run_id, node_base) if local is not None else None
        self.role = "rank" if self._folder is None else ("collector" if local == 0 else "member")
        self._own: PulseRecordWriter | None = None  # this rank's shared record
        self._slot: RecordFile | None = None  # member: its record in node memory
        self._node: RecordFile | None = None  # collector: the node's shared file
        self._mark: RecordFile | None = None
        root = writer.run_dir.root
        if self.role == "collector":
            assert self._folder is not None
            self._node = RecordFile(
                pulses_folder(root) / node_file_name(writer.attempt, writer.rank)
            )
            self._mark = RecordFile(self._folder / _MARK, 0o600)
        elif self.role == "member":
            assert self._folder is not None
            slot = self._folder / record_name(writer.attempt, writer.rank)
            self._slot = RecordFile(slot, 0o600)
        else:
            self._own = self._shared_record()

    def _shared_record(self) -> PulseRecordWriter:
        w = self._writer
        return PulseRecordWriter(
            w.run_dir.root, run=w.run_id, attempt=w.attempt, rank=w.rank, host=w.host
        )

    def write(self, *, t: float, step: int | None, since: float) -> None:
        """One pulse: this rank alive at ``t``, at ``step`` since ``since``."""
        data = self._maker.next(t=t, step=step, since=since)
        if self._node is not None and self._mark is not None:
            self._node.write(data + self._members())
            self._mark.write(b"%d %.3f\n" % (os.getpid(), t))
            return
        if self._slot is not None:
            self._slot.write(data)
            if self._collector_fresh(t):
                if self._own is not None:  # the collector is back: stop writing our own
                    self._own.close()
                    self._own = None
                return
            if self._own is None:
                self._own = self._shared_record()
        assert self._own is not None
        self._own.write(t=t, step=step, since=since)

    def _collector_fresh(self, now: float) -> bool:
        assert self._folder is not None
        try:
            st = os.stat(self._folder / _MARK)
        except OSError:
            return False
        return now - st.st_mtime < COLLECTOR_FRESH_S

    def _members(self) -> bytes:
        """Every other rank's record of this attempt in the node folder, by rank."""
        assert self._folder is not None
        w = self._writer
        found: list[tuple[int, bytes]] = []
        with contextlib.suppress(OSError), os.scandir(self._folder) as entries:
            for entry in entries:
                m = _SLOT_RE.match(entry.name)
                if m is None or int(m[1]) != w.attempt or int(m[2]) == w.rank:
                    continue
                data = _read_slot(entry.path)
                rec = decode(data) if data else None
                if rec is None or isinstance(rec, str) or rec.run != w.run_id:
                    continue  # torn while its rank rewrote it: its last copy waits a second
                found.append((rec.rank, data))
        return b"".join(data for _, data in sorted(found))

    def close(self) -> None:
        """Stop: this rank's slot and mark are removed (its shared files stay, aging)."""
        for f in (self._own, self._slot, self._node, self._mark):
            if f is not None:
                f.close()
        for f in (self._slot, self._mark):
            if f is not None:
                with contextlib.suppress(OSError):
                    os.unlink(f.path)
        if self._folder is not None:
            with contextlib.suppress(OSError):
                self._folder.rmdir()  # the last rank of the node to stop removes it


def _read_slot(path: str) -> bytes:
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError:
        return b""
    try:
        return os.pread(fd, RECORD_BYTES, 0)
    except OSError:
        return b""
    finally:
        os.close(fd)
