"""Opening a run from a snapshot of its replayed state plus the tail of its log (issue 24).

A reader that replayed a large part of a run's log (``ckptdash status``, ``health``,
``goodput``, the dashboard, ``watch``) writes ``RUN/snapshot/state-v1.json``: the state it
built (:mod:`ckptdash.state.state_codec`) and where its tailer stands in each event file. The
next reader restores both and reads only what was appended since. The file is trusted only
when everything about it checks out (docs/format.md, "The snapshot"):

* a regular file, never through a link, at most :data:`MAX_SNAPSHOT_BYTES`, in a
  ``snapshot/`` folder that is not a link;
* owned by the run's owner -- the owner of the run folder, never whoever owns ``run.json``
  today (:func:`ckptdash.rundir.door.run_owner`) -- with one link and writable by nobody
  else, in a ``snapshot/`` folder the owner owns and nobody else may write: in a group folder
  a peer cannot plant one (not even beside a ``run.json`` copy of their own), nor edit the
  owner's;
* of this format, version, ckptdash version and state shape, for this run id, its body
  intact (its SHA-256 and length in the header line);
* every event file it names still the same file: the same inode, no shorter than the offset,
  the bytes just before the offset and at the start unchanged (SHA-256), and a file no longer
  than it was not modified since.

Anything else -- missing, stale, corrupt, of another version or run, planted, hostile -- and
the reader replays the whole log, as it did before snapshots existed: a snapshot can make an
open faster, never its answer different (tests/state/test_snapshot.py checks it against full
replays of random logs).
"""

from __future__ import annotations

import errno
import hashlib
import os
import socket
import stat
import time
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from ckptdash.control.dirs import write_at
from ckptdash.rundir import RunDir, door
from ckptdash.rundir.safe_read import O_CLOEXEC, O_DIRECTORY, open_dir, open_regular
from ckptdash.state import RunState
from ckptdash.state.state_codec import decode_body, fingerprint
from ckptdash.tail import Position, RunTailer

SNAPSHOT_DIR: Final = "snapshot"
SNAPSHOT_FILE: Final = "state-v1.json"
FORMAT: Final = "ckptdash-snapshot"
VERSION: Final = 1
MAX_SNAPSHOT_BYTES: Final = 256 << 20
"""A snapshot larger than this is not read (a 1,024-rank run's is a few MB)."""
HEADER_BYTES: Final = 4096
"""Most bytes the header line may take."""
CHECK_BYTES: Final = 4096
"""Bytes hashed at the start of each event file and just before its offset."""
SNAPSHOT_AFTER_BYTES: Final = 2 << 20
"""A reader that had to read more of the log than this writes a fresh snapshot."""

_decode = msgspec.json.Decoder()
_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class Opened:
    """What :func:`restore` found: the state and tailer to go on with, or why not."""

    state: RunState | None
    tailer: RunTailer | None
    why_not: str
    read_from: int = 0
    """Bytes of event log the snapshot covers (what the reader does not read again)."""


def snapshot_path(run: RunDir) -> str:
    return os.path.join(run.root, SNAPSHOT_DIR, SNAPSHOT_FILE)


def run_owner(run: RunDir) -> int | None:
    """The run's owner: the uid owning the run folder (None when it cannot be looked at)."""
    return door.run_owner(run.root)


def _span_hash(fd: int, start: int, end: int) -> str:
    data = os.pread(fd, end - start, start) if end > start else b""
    if len(data) != end - start:
        raise OSError(errno.EIO, "the file changed while being checked")
    return hashlib.sha256(data).hexdigest()


def _file_record(events_dir: str, name: str, p: Position) -> dict[str, Any]:
    fd, st = open_regular(os.path.join(events_dir, name))
    end = p.offset + p.scanned  # what was read, and searched of an oversize line
    try:
        if st.st_ino != p.ino or st.st_size < end:
            raise OSError(errno.ESTALE, "changed since it was read")
        head = _span_hash(fd, 0, min(CHECK_BYTES, end))
        tail = _span_hash(fd, max(0, end - CHECK_BYTES), end)
    finally:
        os.close(fd)
    return {
        "offset": p.offset,
        "lineno": p.lineno,
        "scanned": p.scanned,
        "first": p.first,
        "ino": st.st_ino,
        "dev": st.st_dev,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "head_sha256": head,
        "tail_sha256": tail,
    }


def _why_file_changed(events_dir: str, name: str, rec: Any) -> str:
    """Why the event file ``name`` is no longer what the snapshot read ("" when it is)."""
    if type(rec) is not dict:
        return f"{name}: not a file record"
    numbers = [rec.get(k) for k in ("offset", "lineno", "scanned", "ino", "dev", "size")]
    if any(type(n) is not int or n < 0 for n in numbers) or rec.get("lineno", 0) < 1:
        return f"{name}: a file record with a bad number"
    end, ino, size = rec["offset"] + rec["scanned"], rec["ino"], rec["size"]
    if end > size:
        return f"{name}: a file record read past the file's size"
    try:
        fd, st = open_regular(os.path.join(events_dir, name))
    except FileNotFoundError:
        return f"{name} is gone"
    except (OSError, KeyError, TypeError, ValueError) as exc:
        return f"{name}: {exc}"
    try:
        if st.st_ino != ino or st.st_dev != rec["dev"]:
            return f"{name} was replaced"
        if st.st_size < end:
            return f"{name} is shorter than the snapshot read ({st.st_size} < {end} bytes)"
        if st.st_size <= size and st.st_mtime_ns != rec["mtime_ns"]:
            return f"{name} was modified in place"
        if _span_hash(fd, 0, min(CHECK_BYTES, end)) != rec["head_sha256"]:
            return f"{name}: its first bytes changed"
        if _span_hash(fd, max(0, end - CHECK_BYTES), end) != rec["tail_sha256"]:
            return f"{name}: the bytes before the snapshot's offset changed"
    except OSError as exc:
        return f"{name}: {exc.strerror or exc}"
    finally:
        os.close(fd)
    return ""


# --- writing -----------------------------------------------------------------------------------


def why_not_write(run: RunDir, state: RunState, tailer: RunTailer) -> str:
    """Why a snapshot of ``state`` and ``tailer`` would not be one a replay agrees with, or
    would not be trusted ("" when it may be written)."""
    if not fingerprint():
        return "ckptdash's source cannot be read to fingerprint the snapshot"
    if not state.run_id or state.run_id != tailer.run_id:
        return "the run has no run id of its own yet (run.json)"
    if tailer.restarts or tailer.reports:
        return "a file was read again from its start, or could not be read"
    if not tailer.caught_up:
        return "the tailer is not caught up"
    if run_owner(run) != os.geteuid():
        return "only the run's owner writes its snapshot"
    return ""


def write(run: RunDir, state: RunState, tailer: RunTailer) -> str:
    """Write the snapshot of ``state`` (the log read up to ``tailer``'s positions) atomically;
    returns "" when written, else why not (never raises for a run directory's trouble)."""
    why = why_not_write(run, state, tailer)
    if why:
        return why
    events_dir = str(run.events)
    try:
        files = {n: _file_record(events_dir, n, p) for n, p in tailer.positions().items()}
        body = _encode(
            {
                "files": files,
                "cwd": os.getcwd(),
                "checkpoint_dirs": state.checkpoint_dirs,
                "state": state.export(),
            }
        )
    except (OSError, ValueError) as exc:
        return f"cannot take a snapshot: {exc}"
    header = {
        "format": FORMAT,
        "version": VERSION,
        "code": fingerprint(),
        "run_id": state.run_id,
        "written_at": time.time(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "body_bytes": len(body),
        "body_sha256": hashlib.sha256(body).hexdigest(),
    }
    try:
        _write_at(run, _encode(header) + b"\n" + body + b"\n")
    except OSError as exc:
        return f"cannot write {snapshot_path(run)}: {exc.strerror or exc}"
    return ""


def _write_at(run: RunDir, data: bytes) -> None:
    """temp file + fsync + rename inside ``snapshot/``, every step relative to held folder
    descriptors (a folder swapped for a link is never written through), the folder ours."""
    root = os.open(run.root, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    try:
        folder = open_dir(SNAPSHOT_DIR, dir_fd=root, create=True)
    finally:
        os.close(root)
    try:
        if os.fstat(folder).st_uid != os.geteuid():
            raise OSError(errno.EPERM, "snapshot/ belongs to another account; not written")
        st = os.fstat(folder)
        if door.others_can_write(st):  # an old run's: the owner's alone from now on
            os.fchmod(folder, stat.S_IMODE(st.st_mode) & ~door.OTHERS_WRITE)
        # 0644 whatever the umask: readable by the group, never writable by it.
        write_at(folder, SNAPSHOT_FILE, data, mode=0o644, exact_mode=True)
    finally:
        os.close(folder)


# --- reading -----------------------------------------------------------------------------------


def _read(run: RunDir) -> tuple[bytes, os.stat_result, os.stat_result]:
    """The snapshot's bytes, its ``fstat`` and its folder's, through the one door."""
    root = os.open(run.root, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    try:
        folder = open_dir(SNAPSHOT_DIR, dir_fd=root)
    finally:
        os.close(root)
    try:
        data, st = door.read_at(folder, SNAPSHOT_FILE, MAX_SNAPSHOT_BYTES, path=snapshot_path(run))
        return data, st, os.fstat(folder)
    finally:
        os.close(folder)


def restore(run: RunDir, run_id: str) -> Opened:
    """The state and tailer the snapshot of ``run`` describes, checked as the module
    docstring says; ``Opened.why_not`` says why there is none (then replay)."""
    if not run_id:
        return Opened(None, None, "the run has no run.json")
    try:
        data, st, folder = _read(run)
    except FileNotFoundError:
        return Opened(None, None, "no snapshot")
    except OSError as exc:
        return Opened(None, None, f"{snapshot_path(run)}: {exc.strerror or exc}")
    owner = run_owner(run)
    if st.st_uid != owner or st.st_mode & 0o022 or st.st_nlink != 1:
        return Opened(None, None, "the snapshot is not the run owner's alone (planted?)")
    if folder.st_uid != owner or door.others_can_write(folder):
        return Opened(None, None, f"{SNAPSHOT_DIR}/ is not the run owner's alone (planted?)")
    try:
        return _restore(run, run_id, data)
    except Exception as exc:  # a hostile body may provoke anything: replay instead
        return Opened(None, None, f"the snapshot does not restore ({type(exc).__name__}: {exc})")


def _restore(run: RunDir, run_id: str, data: bytes) -> Opened:
    end = data.find(b"\n", 0, HEADER_BYTES)
    if end < 0:
        return Opened(None, None, "no header line")
    header = _decode.decode(data[:end])
    body = data[end + 1 :].rstrip(b"\n")
    if type(header) is not dict or header.get("format") != FORMAT:
        return Opened(None, None, "not a ckptdash snapshot")
    if header.get("version") != VERSION:
        return Opened(None, None, "a snapshot of another version of the format")
    if not fingerprint() or header.get("code") != fingerprint():
        return Opened(None, None, "a snapshot another version of ckptdash wrote")
    if header.get("run_id") != run_id:
        return Opened(None, None, "a snapshot of another run")
    if header.get("body_bytes") != len(body) or (
        header.get("body_sha256") != hashlib.sha256(body).hexdigest()
    ):
        return Opened(None, None, "the snapshot's body is torn or corrupt")
    doc = decode_body(body)  # every type checked: a body of another shape fails here
    files = doc.files
    if doc.cwd != os.getcwd():
        # A declared folder written relative was made absolute against the writer's cwd.
        cwd = doc.cwd.rstrip(os.sep) + os.sep
        if any(d.startswith(cwd) for d in doc.checkpoint_dirs):
            return Opened(None, None, "written from another working directory")
    events_dir = str(run.events)
    positions = {}
    for name, rec in files.items():
        if type(name) is not str or os.sep in name or name.startswith("."):
            return Opened(None, None, f"a file record for {name!r}")
        if why := _why_file_changed(events_dir, name, rec):
            return Opened(None, None, why)
        first = rec["first"]
        if first is not None and type(first) is not str:
            return Opened(None, None, f"{name}: a bad record")
        positions[name] = Position(
            int(rec["offset"]), int(rec["lineno"]), int(rec["ino"]), int(rec["scanned"]), first
        )
    state = RunState.restore(doc.state, str(run.root), run_id)
    tailer = RunTailer(run)
    tailer.resume(positions, run_id)
    return Opened(state, tailer, "", sum(p.offset + p.scanned for p in positions.values()))
