"""What the control channel's files share: their size limit, mode and safe reading.

Used by :mod:`ckptdash.control` (commands) and :mod:`ckptdash.control.settings` (the settings file);
nothing here knows what a command or a setting means.
"""

from __future__ import annotations

import errno
import getpass
import os
import socket
from pathlib import Path
from typing import Final, TypeAlias

from ckptdash.errors import (
    ControlError,
    MalformedControlFile,
    NotARegularFile,
    RunDirError,
    UnreadableControlFile,
)
from ckptdash.rundir import RunDir
from ckptdash.rundir.door import make_folders
from ckptdash.rundir.safe_read import read_capped_stat

MAX_CONTROL_FILE_BYTES: Final = 64 * 1024
"""A command or settings file larger than this is malformed; it is rejected without being read."""
FILE_MODE: Final = 0o600  # commands and settings say who did what: owner-only

PathArg: TypeAlias = "str | os.PathLike[str] | RunDir"


def read_small(
    path: Path, fix: str, *, follow_symlinks: bool = True, dir_fd: int | None = None
) -> bytes:
    """Read a control file of at most MAX_CONTROL_FILE_BYTES; anything else is malformed.

    Through :func:`~ckptdash.rundir.safe_read.read_capped`: opened non-blocking so a FIFO cannot
    hang the training loop, checked to be a regular file, and never read past the limit
    however big it is. ``dir_fd``: ``path`` is a name in that (held) folder.
    """
    return read_small_stat(path, fix, follow_symlinks=follow_symlinks, dir_fd=dir_fd)[0]


def read_small_stat(
    path: Path, fix: str, *, follow_symlinks: bool = False, dir_fd: int | None = None
) -> tuple[bytes, os.stat_result]:
    """:func:`read_small`, and the ``fstat`` of the very file read (its owner, its mode)."""
    try:
        return read_capped_stat(
            path.name if dir_fd is not None else path,
            MAX_CONTROL_FILE_BYTES,
            follow_symlinks=follow_symlinks,
            dir_fd=dir_fd,
        )
    except FileNotFoundError:
        raise
    except NotARegularFile as exc:
        if exc.errno == errno.EFBIG:
            raise MalformedControlFile(
                f"{path}: {exc.strerror} (a control file holds at most"
                f" {MAX_CONTROL_FILE_BYTES}); not read. {fix}"
            ) from None
        raise MalformedControlFile(f"{path}: {exc.strerror}; remove it. {fix}") from None
    except OSError as exc:
        raise UnreadableControlFile(
            f"{path}: cannot read it ({exc.strerror}); check its permissions. {fix}"
        ) from None


def run_of(run_dir: PathArg) -> RunDir:
    return run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)


def existing_run(run_dir: PathArg) -> RunDir:
    """The run at ``run_dir``; the dashboard side never creates a run, only its control files."""
    rd = run_of(run_dir)
    if not rd.root.is_dir():
        raise RunDirError(
            f"{rd.root}: no such run directory; pass the run directory your training writes to"
            " (the run_dir given to CkptDashCallback or Monitor)"
        )
    if not rd.is_run():
        raise RunDirError(
            f"{rd.root}: not a ckptdash run (no events/ folder); pass the run directory your"
            " training writes to, or start the training first"
        )
    return rd


def make_dirs(path: Path) -> None:
    try:
        make_folders(path)
    except OSError as exc:
        raise ControlError(
            f"{path}: cannot create the folder ({exc.strerror}); check the run directory's"
            " permissions"
        ) from exc


def user_at_host() -> str:
    """``user@host``: who the audit trail names for a change made by this process."""
    return f"{default_author()}@{socket.gethostname()}"


def default_author() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError, ImportError):  # no login name in the environment or passwd
        return f"uid-{os.getuid()}" if hasattr(os, "getuid") else "unknown"
