"""What the control channel's files share: their size limit, mode and safe reading.

Used by :mod:`ckptdash.control` (commands) and :mod:`ckptdash.control.settings` (the settings file);
nothing here knows what a command or a setting means.
"""

from __future__ import annotations

import errno
import getpass
import os
import socket
import stat
from pathlib import Path
from typing import Final, TypeAlias

from ckptdash.errors import ControlError, MalformedControlFile, RunDirError, UnreadableControlFile
from ckptdash.rundir import RunDir

MAX_CONTROL_FILE_BYTES: Final = 64 * 1024
"""A command or settings file larger than this is malformed; it is rejected without being read."""
FILE_MODE: Final = 0o600  # commands and settings say who did what: owner-only

PathArg: TypeAlias = "str | os.PathLike[str] | RunDir"


def read_small(path: Path, fix: str, *, follow_symlinks: bool = True) -> bytes:
    """Read a control file of at most MAX_CONTROL_FILE_BYTES; anything else is malformed.

    Opened non-blocking so a FIFO cannot hang the training loop, checked to be a
    regular file, and never read past the limit however big it is.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = -1
    try:
        fd = os.open(path, flags)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise MalformedControlFile(f"{path}: {kind}; remove it. {fix}")
        if st.st_size > MAX_CONTROL_FILE_BYTES:
            raise MalformedControlFile(
                f"{path}: {st.st_size} bytes, more than a control file may hold"
                f" ({MAX_CONTROL_FILE_BYTES}); not read. {fix}"
            )
        with os.fdopen(fd, "rb") as f:
            fd = -1  # the file object owns it now
            data = f.read(MAX_CONTROL_FILE_BYTES + 1)
        if len(data) > MAX_CONTROL_FILE_BYTES:  # grew after fstat
            raise MalformedControlFile(
                f"{path}: more than {MAX_CONTROL_FILE_BYTES} bytes; not read. {fix}"
            )
        return data
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link
            raise MalformedControlFile(f"{path}: a symbolic link; remove it. {fix}") from None
        raise UnreadableControlFile(
            f"{path}: cannot read it ({exc.strerror}); check its permissions. {fix}"
        ) from None
    finally:
        if fd >= 0:
            os.close(fd)


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
        path.mkdir(parents=True, exist_ok=True)
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
