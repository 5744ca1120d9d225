"""Opening what comes from a run directory without trusting it: the one safe-open helper.

Anyone who can write a run directory (a project group, a compute node's code) can put a FIFO
where ``run.json`` belongs, link a manifest to ``/dev/zero``, or swap a folder for a symbolic
link to the owner's home. Plain ``open()`` then blocks for ever on the FIFO, reads without end
from the device, or follows the link. So every file ckptdash reads from a run directory goes
through :func:`open_regular`:

* opened ``O_NONBLOCK`` (a FIFO cannot block the open) and, where the file is the run's own,
  ``O_NOFOLLOW`` (a symbolic link is refused, never followed);
* checked with ``fstat`` on the opened descriptor, never a second lookup by name, to be a
  regular file (a FIFO, a device, a socket or a directory is refused);
* read at most up to a cap (:func:`read_capped`), or hashed at most up to the size the record
  names (:mod:`ckptdash.rundir.hashing`, :mod:`ckptdash.rundir.manifest`).

A refused file raises :class:`~ckptdash.errors.NotARegularFile`, an ``OSError``, so every
caller that already reports an unreadable file reports this one the same way, naming it.

Folders are opened the same way (:func:`open_dir`): ``O_DIRECTORY | O_NOFOLLOW``, relative to a
descriptor already held, so a folder swapped for a link after the check is never entered.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from typing import Final

from ckptdash.errors import NotARegularFile

O_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
O_NONBLOCK: Final = getattr(os, "O_NONBLOCK", 0)
O_DIRECTORY: Final = getattr(os, "O_DIRECTORY", 0)
O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
SMALL_FILE_BYTES: Final = 64 * 1024
"""The cap for small JSON files of a run (``run.json``, a command, the settings)."""


def kind_of(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def open_regular(
    path: str | os.PathLike[str],
    *,
    follow_symlinks: bool = False,
    dir_fd: int | None = None,
) -> tuple[int, os.stat_result]:
    """Open ``path`` for reading as a regular file: the descriptor and its ``fstat``.

    Raises ``FileNotFoundError`` when it is missing, :class:`NotARegularFile` for a symbolic
    link (unless ``follow_symlinks``; a link's target must still be a regular file), a FIFO,
    a device, a socket or a directory, and ``OSError`` for anything else. Never blocks.
    """
    flags = os.O_RDONLY | O_NONBLOCK | O_CLOEXEC | (0 if follow_symlinks else O_NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise NotARegularFile(errno.ELOOP, "a symbolic link, not followed", str(path)) from None
        if exc.errno == errno.ENXIO:  # a socket, or a FIFO opened where O_NONBLOCK refuses
            raise NotARegularFile(errno.ENXIO, "not a regular file", str(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(
                errno.EINVAL, f"{kind_of(st.st_mode)}, not a regular file", str(path)
            )
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_capped(
    path: str | os.PathLike[str],
    limit: int = SMALL_FILE_BYTES,
    *,
    follow_symlinks: bool = False,
    dir_fd: int | None = None,
) -> bytes:
    """The bytes of the regular file ``path``, refused when larger than ``limit``.

    Raises what :func:`open_regular` raises, and :class:`NotARegularFile` (``EFBIG``) for a
    file over the cap, which is never read past it.
    """
    return read_capped_stat(path, limit, follow_symlinks=follow_symlinks, dir_fd=dir_fd)[0]


def read_capped_stat(
    path: str | os.PathLike[str],
    limit: int = SMALL_FILE_BYTES,
    *,
    follow_symlinks: bool = False,
    dir_fd: int | None = None,
) -> tuple[bytes, os.stat_result]:
    """:func:`read_capped`, and the ``fstat`` of the very file read (its owner, its mode)."""
    fd, st = open_regular(path, follow_symlinks=follow_symlinks, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as f:
        if st.st_size > limit:
            raise NotARegularFile(
                errno.EFBIG, f"{st.st_size} bytes, more than the {limit} it may hold", str(path)
            )
        data = f.read(limit + 1)
    if len(data) > limit:  # it grew after fstat
        raise NotARegularFile(errno.EFBIG, f"more than the {limit} bytes it may hold", str(path))
    return data, st


def open_dir(name: str, *, dir_fd: int | None = None, create: bool = False) -> int:
    """A descriptor of the folder ``name`` (relative to ``dir_fd``), never through a link.

    With ``create`` a missing folder is made first, mode 0755 whatever the umask (a run's
    folder is its owner's alone: :mod:`ckptdash.rundir.door`).
    Raises ``FileNotFoundError`` when it is missing, :class:`NotARegularFile` (``ELOOP`` or
    ``ENOTDIR``) for a symbolic link or a file in its place, and ``OSError`` otherwise.
    """
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=dir_fd)
    try:
        return os.open(name, os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        # Linux answers ENOTDIR for a link with O_DIRECTORY | O_NOFOLLOW: say which it is.
        try:
            link = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except OSError:
            link = exc.errno == errno.ELOOP
        if link:
            raise NotARegularFile(errno.ELOOP, "a symbolic link, not followed", name) from None
        raise NotARegularFile(errno.ENOTDIR, "not a folder", name) from None
