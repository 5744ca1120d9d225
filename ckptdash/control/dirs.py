"""The control folders as held directory descriptors: never entered through a link, used by
the job only when its own user owns them, and scanned in bounded slices.

In a group project folder (setgid, mode 2775, umask 002) every member of the group can rename
``control/done`` away and put a symbolic link to the job owner's home in its place, or point
``control/inbox`` at a private folder of the owner's. A job that moved files by path would then
move a file named ``.bashrc`` over ``~/.bashrc``, or "claim" the owner's private files into a
folder the group can read. So, as maildir delivery does:

* each folder is opened with ``O_DIRECTORY | O_NOFOLLOW`` relative to the descriptor of the
  folder above it (:func:`~ckptdash.rundir.safe_read.open_dir`), and every rename, read and create
  happens relative to those held descriptors, never by path again;
* the training job uses a control folder only when the job's own user owns it
  (:func:`job_folder`): a folder another account made is refused, with the reason;
* only regular files with command-shaped names are claimed (:class:`InboxScan`), never a
  folder, a link, a FIFO or ``.bashrc``;
* the inbox is read with ``os.scandir`` in slices bounded by time, the position kept between
  checks, so 300,000 junk files never stall a training step by more than a few milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

from ckptdash.errors import ControlError, NotARegularFile
from ckptdash.rundir import CONTROL_DIR, TEMP_PREFIX, RunDir
from ckptdash.rundir.door import user_name as user_name
from ckptdash.rundir.safe_read import O_CLOEXEC, O_DIRECTORY, O_NOFOLLOW, open_dir

SCAN_BUDGET_S: Final = 0.002
"""Most time one check spends listing the inbox; a longer listing goes on at the next check."""
_CHECK_CLOCK_EVERY: Final = 64  # entries between two looks at the clock


def _refusal(path: Path, exc: OSError) -> ControlError:
    if isinstance(exc, NotARegularFile):
        return ControlError(
            f"{path}: {exc.strerror}; refusing to use it for commands. Remove it: the job"
            " recreates the folder"
        )
    return ControlError(
        f"{path}: cannot open the folder ({exc.strerror}); check the run directory's permissions"
    )


@contextlib.contextmanager
def control_fd(run: RunDir, *, create: bool = False) -> Iterator[int]:
    """A held descriptor of ``control/`` (never through a link), for the settings file.

    No owner check: a colleague's dashboard in a group folder writes the owner's settings.
    Raises ``FileNotFoundError`` when the run has no ``control/`` (and not ``create``),
    :class:`ControlError` when it is a link or cannot be opened.
    """
    try:
        root = os.open(run.root, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise _refusal(run.root, exc) from None
    try:
        try:
            fd = open_dir(CONTROL_DIR, dir_fd=root, create=create)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise _refusal(run.root / CONTROL_DIR, exc) from None
    finally:
        os.close(root)
    try:
        yield fd
    finally:
        os.close(fd)


def job_folder(run: RunDir, name: str, *, create: bool = False, own: bool = True) -> int:
    """A descriptor of ``control/<name>`` for the training job: opened without following a
    link at either level and, with ``own``, owned by this process's user.

    Raises ``FileNotFoundError`` when it is missing (and not ``create``) and
    :class:`ControlError` naming the folder, why it is refused and the fix.
    """
    with control_fd(run, create=create) as control:
        path = run.root / CONTROL_DIR / name
        if own:
            _check_owner(run.root / CONTROL_DIR, os.fstat(control).st_uid)
        try:
            fd = open_dir(name, dir_fd=control, create=create)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise _refusal(path, exc) from None
    if own:
        try:
            _check_owner(path, os.fstat(fd).st_uid)
        except BaseException:
            os.close(fd)
            raise
    return fd


def _check_owner(path: Path, uid: int) -> None:
    me = os.geteuid()
    if uid != me:
        raise ControlError(
            f"{path}: owned by {user_name(uid)}, not by {user_name(me)} who runs the job;"
            " refusing to move command files through a folder another account made. Remove"
            " it: the job recreates it"
        )


def fsync_fd(fd: int) -> None:
    """Make a rename inside the held folder durable (ignored where the filesystem refuses)."""
    with contextlib.suppress(OSError):
        os.fsync(fd)


def regular_files(dir_fd: int) -> list[str]:
    """Names of the regular files in the held folder (no links, folders, FIFOs), sorted."""
    with os.scandir(dir_fd) as it:
        return sorted(e.name for e in it if e.is_file(follow_symlinks=False))


def write_at(dir_fd: int, name: str, data: bytes, *, mode: int, exact_mode: bool = False) -> None:
    """Replace ``name`` in the held folder atomically: a temp file next to it, fsync,
    ``rename`` relative to the descriptor (so a folder swapped for a link meanwhile is never
    written through), fsync of the folder. The file gets ``mode`` less the umask, or exactly
    ``mode`` with ``exact_mode``."""
    tmp = f"{TEMP_PREFIX}{name}.{os.getpid()}.{secrets.token_hex(4)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC
    fd = os.open(tmp, flags, mode, dir_fd=dir_fd)
    try:
        if exact_mode:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    fsync_fd(dir_fd)


class InboxScan:
    """Where the job's listing of its inbox stands, kept from one check to the next.

    Each :meth:`take` lists for at most :data:`SCAN_BUDGET_S`, remembering the position; once
    a pass over the folder is complete, the command-shaped regular files it found are handed
    out oldest first (ids sort by creation time), ``limit`` per check. An inbox of a few
    thousand files is listed in one check, so its commands come in order; a flood of junk
    only delays commands by a number of checks, and never a step by more than the budget.
    """

    def __init__(self, budget_s: float = SCAN_BUDGET_S) -> None:
        self.budget_s = budget_s
        self._it: Iterator[os.DirEntry[str]] | None = None
        self._folder: tuple[int, int] | None = None  # (st_dev, st_ino) being listed
        self._found: list[str] = []
        self._ready: list[str] = []

    def take(self, inbox: int, limit: int, is_command_name: Callable[[str], bool]) -> list[str]:
        """Up to ``limit`` names to claim from the held inbox (none while a pass goes on)."""
        st = os.fstat(inbox)
        folder = (st.st_dev, st.st_ino)
        if folder != self._folder:  # a new inbox folder: start over
            self.close()
            self._folder = folder
        if not self._ready and not self._scan(inbox, is_command_name):
            return []
        batch, self._ready = self._ready[: max(1, limit)], self._ready[max(1, limit) :]
        return batch

    def _scan(self, inbox: int, is_command_name: Callable[[str], bool]) -> bool:
        """List on from where the last check stopped; True once the pass is complete."""
        if self._it is None:
            self._it = os.scandir(inbox)  # holds its own copy of the descriptor
        deadline = time.perf_counter() + self.budget_s
        found = self._found
        for n, entry in enumerate(self._it, 1):
            name = entry.name
            if is_command_name(name) and _is_regular(entry):
                found.append(name)
            if n % _CHECK_CLOCK_EVERY == 0 and time.perf_counter() > deadline:
                return False
        self.close_listing()
        found.sort()
        self._ready, self._found = found, []
        return True

    def close_listing(self) -> None:
        it, self._it = self._it, None
        if it is not None:
            it.close()  # type: ignore[attr-defined]

    def close(self) -> None:
        """Forget the pass in progress (its listing is closed)."""
        self.close_listing()
        self._found, self._ready = [], []


def _is_regular(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file(follow_symlinks=False)
    except OSError:
        return False


def is_regular_at(dir_fd: int, name: str) -> bool:
    """Whether ``name`` in the held folder is a regular file (a link is not)."""
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
