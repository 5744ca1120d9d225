"""The run-directory layout and the one atomic-write helper every file writer uses.

    RUN_DIR/
      run.json                   run id and format version (created once, never rewritten)
      events/                    A{attempt:04d}.R{rank:04d}.{host}.{pid}.jsonl — one writer each
      control/inbox/             one file per pending command (created atomically)
      control/claimed/           commands a training process took (claimed by rename)
      control/done/              commands that have their outcome event
      control/settings.json      durable settings (replaced atomically)
      control/settings.lock      serialises read-modify-write of the settings between writers
      checkpoints/               where ckptdash saves unless told otherwise

Every rule here must hold on NFS and Lustre, where the run directory is
usually shared between compute nodes and the machine the dashboard runs on:
temp files live next to their target (a rename across filesystems is a
copy that ``kill -9`` can truncate), and directories are fsync'ed after a
rename so the new name survives a crash.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

import msgspec

from ckptdash.errors import AtomicWriteError, NotARegularFile, RunDirError
from ckptdash.events.fields import DECODE_ERRORS
from ckptdash.rundir.direct_io import DirectFile
from ckptdash.rundir.door import make_folders
from ckptdash.rundir.hashing import HashingWriter
from ckptdash.rundir.safe_read import O_DIRECTORY, open_dir, read_capped

RUN_FILE: Final = "run.json"
EVENTS_DIR: Final = "events"
CONTROL_DIR: Final = "control"
INBOX_DIR: Final = "control/inbox"
CLAIMED_DIR: Final = "control/claimed"
DONE_DIR: Final = "control/done"
SETTINGS_FILE: Final = "control/settings.json"
CHECKPOINTS_DIR: Final = "checkpoints"
EVENT_SUFFIX: Final = ".jsonl"
TEMP_PREFIX: Final = ".ckptdash-tmp-"


class RunInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Content of ``run.json``."""

    v: int = 1
    run_id: str
    created_at: float


# --- atomic writes ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What an atomic write produced: the final path, its size and checksum."""

    path: Path
    size_bytes: int
    checksum: str


def fsync_dir(path: Path) -> None:
    """Make a rename or create inside ``path`` durable (no-op where a directory can't open)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some network filesystems refuse fsync on directories; the rename still happened
    finally:
        os.close(fd)


def temp_path_for(target: Path) -> Path:
    """A unique temp name in the target's own directory (never ``$TMPDIR``)."""
    return target.with_name(f"{TEMP_PREFIX}{target.name}.{os.getpid()}.{secrets.token_hex(4)}")


def atomic_write(
    target: str | os.PathLike[str],
    content: bytes | Callable[[IO[bytes]], object],
    *,
    mode: int = 0o644,
    fsync: bool = True,
    direct: bool = False,
) -> WriteResult:
    """Write ``target`` so that readers see the old file or the new one, never a mix.

    ``content`` is bytes or a callable that writes to a file object (for example
    ``lambda f: torch.save(state, f)``). The data goes to a temp file in the
    same directory, is fsync'ed, renamed over the target, and the directory is
    fsync'ed. The checksum is computed while writing.

    ``direct``: write around the page cache where the filesystem allows it
    (:mod:`ckptdash.rundir.direct_io`; the same bytes, far less CPU for a large file).

    >>> atomic_write("notes.json", b"{}\\n").size_bytes
    3
    >>> open("notes.json", "rb").read()
    b'{}\\n'
    """
    path = Path(target)
    tmp = temp_path_for(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except OSError as exc:
        raise AtomicWriteError(
            exc.errno,
            f"cannot create a temp file next to {path}: {exc.strerror}; check that"
            " the directory exists and is writable",
            str(tmp),
        ) from exc
    try:
        with DirectFile(fd) if direct else os.fdopen(fd, "wb") as raw:
            writer = HashingWriter(raw)
            try:
                if isinstance(content, (bytes, bytearray, memoryview)):
                    writer.write(content)
                else:
                    content(writer)  # type: ignore[arg-type]
            finally:
                writer.close()
            raw.flush()
            if fsync:
                os.fsync(raw.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        # A serializer may hide the OSError (torch.save turns a full disk into a
        # RuntimeError about zip positions): report the filesystem's own reason.
        cause = _os_error_in(exc) if isinstance(exc, Exception) else None
        if cause is not None and not isinstance(exc, AtomicWriteError):
            raise AtomicWriteError(
                cause.errno,
                f"writing {path} failed ({cause.strerror or cause}); the previous file is intact",
                str(path),
            ) from exc
        raise
    if fsync:
        fsync_dir(path.parent)
    return WriteResult(path, writer.size, writer.checksum)


def _os_error_in(exc: BaseException) -> OSError | None:
    """``exc`` if it is an OSError, else the first OSError it was raised from or during."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def create_exclusive(target: Path, data: bytes, *, mode: int = 0o644) -> bool:
    """Create ``target`` with ``data`` only if no file of that name exists; True if we made it.

    Uses write-temp + ``link`` (atomic and exclusive on NFS too), so a reader
    never sees the file empty or half-written.
    """
    tmp = temp_path_for(target)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, target)
        except FileExistsError:
            return False
        fsync_dir(target.parent)
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def is_temp_file(name: str) -> bool:
    """True for a leftover temp file of an interrupted atomic write."""
    return name.startswith(TEMP_PREFIX)


# --- the layout ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunDir:
    """Paths of one run directory. Creating the object touches nothing on disk."""

    root: Path

    def __init__(self, root: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def events(self) -> Path:
        return self.root / EVENTS_DIR

    @property
    def inbox(self) -> Path:
        return self.root / INBOX_DIR

    @property
    def claimed(self) -> Path:
        return self.root / CLAIMED_DIR

    @property
    def done(self) -> Path:
        return self.root / DONE_DIR

    @property
    def settings(self) -> Path:
        return self.root / SETTINGS_FILE

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS_DIR

    @property
    def run_file(self) -> Path:
        return self.root / RUN_FILE

    def ensure(self) -> RunInfo:
        """Create the layout if missing and return the run's identity (stable across attempts)."""
        for sub in (self.events, self.checkpoints):
            make_folders(sub)  # 0755 whatever the umask: the run is its owner's alone
        self._ensure_control()
        info = RunInfo(run_id=secrets.token_hex(6), created_at=time.time())
        create_exclusive(self.run_file, msgspec.json.encode(info) + b"\n")
        return self.info()

    def _ensure_control(self) -> None:
        """Create control/ and its folders, each relative to the one above and never through a
        link: a control/ that someone swapped for a link to the owner's home must not get
        inbox/, claimed/ and done/ made there (the claimer then refuses the link, saying why)."""
        root = os.open(self.root, os.O_RDONLY | O_DIRECTORY)
        try:
            control = open_dir(CONTROL_DIR, dir_fd=root, create=True)
        except NotARegularFile:
            return
        finally:
            os.close(root)
        try:
            for name in (INBOX_DIR, CLAIMED_DIR, DONE_DIR):
                with contextlib.suppress(NotARegularFile):
                    os.close(open_dir(name.rsplit("/", 1)[1], dir_fd=control, create=True))
        finally:
            os.close(control)

    def info(self) -> RunInfo:
        """The run identity from ``run.json``; a run without one is named after its folder."""
        try:
            # Never through a link, never a FIFO or a device, never more than a small file:
            # whoever writes the run directory could otherwise hang or flood every reader.
            return msgspec.json.decode(read_capped(self.run_file), type=RunInfo)
        except FileNotFoundError:
            return RunInfo(run_id=self.root.name, created_at=0.0)
        except OSError as exc:
            raise RunDirError(
                f"{self.run_file}: cannot read the run file ({exc.strerror}); replace it with a"
                " regular file (or delete it: ckptdash then names the run after its folder)"
            ) from None
        except DECODE_ERRORS as exc:
            raise RunDirError(
                f"{self.run_file}: unreadable run file ({exc}); delete it and ckptdash will"
                " name the run after its folder"
            ) from None

    def is_run(self) -> bool:
        """A folder is a run once it has an ``events/`` directory."""
        return self.events.is_dir()

    def event_file_name(self, attempt: int, rank: int, host: str | None = None) -> str:
        """The name of the event file one process writes; unique per attempt, rank and process."""
        host = _safe(host or socket.gethostname())
        return f"A{attempt:04d}.R{rank:04d}.{host}.{os.getpid()}{EVENT_SUFFIX}"

    def event_files(self) -> list[Path]:
        """Every event file of this run, sorted by name (attempt, then rank)."""
        try:
            return sorted(p for p in self.events.iterdir() if p.name.endswith(EVENT_SUFFIX))
        except FileNotFoundError:
            return []


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:64] or "host"


def find_runs(path: str | os.PathLike[str]) -> list[RunDir]:
    """The run at ``path``, or every run directly below it (a parent folder of runs).

    Raises :class:`RunDirError` with the fix when ``path`` is missing or holds no run.
    """
    root = Path(path)
    if not root.exists():
        raise RunDirError(
            f"{root}: no such directory; pass the run directory your training writes to"
            " (the run_dir given to CkptDashCallback or Monitor)"
        )
    if not root.is_dir():
        raise RunDirError(f"{root}: not a directory; pass a run directory or a folder of runs")
    run = RunDir(root)
    if run.is_run():
        return [run]
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir())
    except PermissionError as exc:
        raise RunDirError(
            f"{root}: cannot list the folder ({exc.strerror}); check its permissions"
        ) from None
    runs = [RunDir(p) for p in children if RunDir(p).is_run()]
    if not runs:
        raise RunDirError(
            f"{root}: holds no ckptdash run (no events/ folder here or one level below);"
            " start training with ckptdash first, or pass the right folder"
        )
    return runs
