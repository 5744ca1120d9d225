"""The one door to the files of a run: every open of a file in a run directory goes through here.

In a group project folder (setgid 2775, umask 002) every member of the group could once create
files inside the owner's run: a link where a kept logger file belongs, a hard link to the
owner's SLURM log in ``events/``, a FIFO where a pulse record is opened. Each reader then had
to defend itself. This module is the other road (OpenSSH's ``StrictModes``, maildir):

* the run's folders are made without group or other write, whatever the umask
  (:data:`FOLDER_MODE`), and the owner's attempt tightens the ones its user owns that others
  may write, and refuses one another account owns or may write (:func:`secure_run`);
* every file is opened relative to a held folder that was never entered through a link,
  ``O_NONBLOCK | O_NOFOLLOW``, and checked by ``fstat`` on the descriptor: a regular file,
  at most a size cap, and where the owner's own file is expected owned by the owner and with
  one link (:func:`open_at`, :func:`read_at`, :func:`open_path`);
* readers ask :func:`untrusted` whether a run's folders are its owner's alone before acting on
  what they hold.

The invariant: nothing ckptdash writes, and nothing it acts on for the owner, can have come
through a name another account could make. Lower-level helpers (:mod:`.safe_read`,
:mod:`ckptdash.control.dirs`) are what this door is built on; the AST test
``tests/rundir/test_one_door.py`` keeps every other open of a run path out of the package.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import pwd
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from ckptdash.errors import NotARegularFile, RunDirError
from ckptdash.rundir.safe_read import (
    O_CLOEXEC,
    O_DIRECTORY,
    O_NOFOLLOW,
    O_NONBLOCK,
    kind_of,
    open_dir,
    open_regular,
)

FOLDER_MODE: Final = 0o755
"""Every folder ckptdash makes in a run: the group reads, only the owner writes (the umask can
only take bits away, never add group write)."""
GROUP_INBOX_MODE: Final = 0o1770
"""The group inbox of a run that opted in to group steering (``Settings.group_steering``):
the group may drop commands, the sticky bit keeps them from removing each other's (and the
owner's), others nothing."""
OTHERS_WRITE: Final = stat.S_IWGRP | stat.S_IWOTH
RUN_FOLDERS: Final = (
    "",
    "events",
    "pulses",
    "snapshot",
    "control",
    "control/inbox",
    "control/claimed",
    "control/done",
    "checkpoints",
)
"""The folders of a run, "" being the run folder itself: each must be the owner's alone."""
GROUP_INBOX: Final = "control/group-inbox"
"""Where group members drop commands when the owner opted in (never one of the folders above)."""
NO_CAP: Final = 1 << 62


@functools.lru_cache(maxsize=256)
def user_name(uid: int) -> str:
    """The account name of ``uid`` (``uid-1234`` when the passwd database has none)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid-{uid}"


def others_can_write(st: os.stat_result) -> bool:
    """Whether someone other than the file's owner may write it (group or other write bit)."""
    return bool(st.st_mode & OTHERS_WRITE)


def run_owner(root: str | os.PathLike[str]) -> int | None:
    """The run's owner: the account that owns the run folder (the one its first attempt made
    or adopted), never whoever owns ``run.json`` today. None when the folder is not there."""
    try:
        st = os.stat(root)
    except OSError:
        return None
    return st.st_uid if stat.S_ISDIR(st.st_mode) else None


def _fix(path: Path, st: os.stat_result, owner: int) -> str:
    if st.st_uid != owner:
        return (
            f"{path} belongs to {user_name(st.st_uid)}, not to {user_name(owner)} who owns the"
            f" run: ask {user_name(st.st_uid)} to remove it (ckptdash recreates it)"
        )
    return (
        f"{path} may be written by the {'group' if st.st_mode & stat.S_IWGRP else 'world'}:"
        f" chmod g-w,o-w {path}"
    )


def untrusted(root: str | os.PathLike[str]) -> str:
    """Why the run at ``root`` is not its owner's alone ("" when it is): the first of its
    folders that another account owns, that the group or others may write, or that is a link.

    What such a folder holds may have been written by anyone who can write it: readers show the
    run as *untrusted* and take no action (no SLURM command) on evidence read from it. A folder
    that is missing is no reason.
    """
    base = Path(root)
    owner = run_owner(base)
    if owner is None:
        return ""
    for name in RUN_FOLDERS:
        path = base / name if name else base
        try:
            st = os.stat(path) if not name else os.lstat(path)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode):
            return f"{path} is a symbolic link: remove it (ckptdash recreates the folder)"
        if not stat.S_ISDIR(st.st_mode):
            continue
        if st.st_uid != owner or others_can_write(st):
            return _fix(path, st, owner)
    return ""


@dataclass
class Secured:
    """What :func:`secure_run` did: the folders it tightened (``chmod go-w``), by path."""

    tightened: list[str] = field(default_factory=list)

    def line(self) -> str:
        """The one line saying so ("" when nothing was tightened)."""
        if not self.tightened:
            return ""
        return (
            f"ckptdash: {', '.join(self.tightened)}: others could write "
            f"{'it' if len(self.tightened) == 1 else 'them'}; removed group/other write"
            " (a run is writable by its owner alone; see docs/security.md)"
        )


def secure_run(root: str | os.PathLike[str], *, group_inbox: bool = False) -> Secured:
    """At an attempt's start: make the run's folders its user's alone, or refuse the run.

    Each folder of :data:`RUN_FOLDERS` that exists is opened relative to the one above without
    following a link; one this user owns that the group or others may write is tightened
    (``fchmod`` on the held descriptor: no other file is touched); one that is a link or that
    another account owns raises :class:`~ckptdash.errors.RunDirError` with one line naming it
    and the fix -- except the command folders under ``control/``, which the command channel
    itself refuses to use (:mod:`ckptdash.control.dirs`: a ``control_failed`` event), so that
    training goes on without commands. Folders missing are left for the job to make
    (:func:`make_folder`).

    ``group_inbox``: the owner opted in to group steering: ``control/group-inbox`` is made (or
    kept) group-writable; otherwise it is closed (mode 0755: the group reads, nobody drops).
    """
    me = os.geteuid()
    base = Path(root)
    done = Secured()
    try:
        held = {"": os.open(base, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)}
    except OSError as exc:
        raise RunDirError(f"{base}: cannot open the run folder ({exc.strerror})") from None
    try:
        for name in (*RUN_FOLDERS, GROUP_INBOX):
            parent, _, leaf = name.rpartition("/")
            path = base / name if name else base
            if name:
                if parent not in held:
                    continue
                try:
                    held[name] = open_dir(leaf, dir_fd=held[parent])
                except FileNotFoundError:
                    continue
                except NotARegularFile as exc:
                    if parent == "control":
                        continue  # the command channel refuses it itself, and trains on
                    raise RunDirError(
                        f"{path}: {exc.strerror}; refusing to train in it. Remove it: ckptdash"
                        " recreates the folder"
                    ) from None
            fd = held[name]
            st = os.fstat(fd)
            if st.st_uid != me and parent == "control":
                # control/inbox, claimed/, done/ or the group inbox of another account: the
                # command channel never moves a file through it (a control_failed event says
                # so at every attempt), and training goes on.
                continue
            if st.st_uid != me:
                raise RunDirError(f"{path}: refusing to train in it: {_fix(path, st, me)}")
            if name == GROUP_INBOX:
                want = GROUP_INBOX_MODE if group_inbox else FOLDER_MODE
                if stat.S_IMODE(st.st_mode) & 0o7777 != want:
                    os.fchmod(fd, want)
                continue
            if others_can_write(st):
                os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~OTHERS_WRITE)
                done.tightened.append(str(path))
        if group_inbox and "control" in held and GROUP_INBOX not in held:
            os.close(make_folder("group-inbox", held["control"], mode=GROUP_INBOX_MODE))
    finally:
        for fd in held.values():
            os.close(fd)
    return done


def group_steering(root: str | os.PathLike[str]) -> bool:
    """Whether the owner opted in to group steering: ``group_steering`` in a
    ``control/settings.json`` this user owns (one link, never through a link). Anything
    else -- no file, another account's file, an unreadable one -- is no."""
    from ckptdash.events import decode_settings

    try:
        with folder(Path(root) / "control") as control:
            data, _ = read_at(control, "settings.json", 64 * 1024, own=True)
        return decode_settings(data, "settings.json").group_steering
    except Exception:
        return False


def secure_attempt(root: str | os.PathLike[str], *, say: bool = True) -> Secured:
    """:func:`secure_run` at the start of an attempt of the run at ``root`` (made when missing,
    mode 0755), with the owner's group-steering choice; with ``say`` (rank 0) the one line
    about what was tightened goes to stderr. Every rank calls it before reading or writing
    anything of the run, so every rank stops with the same refusal."""
    make_folders(root)
    done = secure_run(root, group_inbox=group_steering(root))
    if say and done.line():
        print(done.line(), file=sys.stderr, flush=True)
    return done


def own_folder(path: str | os.PathLike[str]) -> int:
    """A held descriptor of a folder ckptdash writes into for the run outside its layout (a
    logger's version folder it creates or continues): made with :data:`FOLDER_MODE` when
    missing, tightened (``chmod go-w``) when this user owns it and others may write it.
    Raises :class:`~ckptdash.errors.RunDirError` naming it when it is a link or another
    account's."""
    p = Path(path)
    try:
        make_folders(p.parent)
        parent = os.open(p.parent, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        try:
            fd = make_folder(p.name, parent)
        finally:
            os.close(parent)
    except OSError as exc:
        raise RunDirError(f"{p}: cannot use the folder ({exc.strerror})") from None
    st = os.fstat(fd)
    me = os.geteuid()
    if st.st_uid != me:
        os.close(fd)
        raise RunDirError(f"{p}: not continued: {_fix(p, st, me)}")
    if others_can_write(st):
        os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~OTHERS_WRITE)
    return fd


def is_own_file(dir_fd: int, name: str) -> bool:
    """Whether ``name`` in the held folder is this user's own regular file with one link."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and not _refused(st, own=True, cap=NO_CAP)


def make_folder(name: str, dir_fd: int | None, *, mode: int = FOLDER_MODE) -> int:
    """A held descriptor of the folder ``name`` (relative to ``dir_fd``), made with ``mode``
    when missing (:data:`FOLDER_MODE`: no group write whatever the umask), never a link."""
    try:
        os.mkdir(name, FOLDER_MODE, dir_fd=dir_fd)
    except FileExistsError:
        pass
    else:
        if mode != FOLDER_MODE:
            fd = open_dir(name, dir_fd=dir_fd)
            os.fchmod(fd, mode)
            return fd
    return open_dir(name, dir_fd=dir_fd)


def make_folders(path: str | os.PathLike[str]) -> None:
    """``mkdir -p path`` with :data:`FOLDER_MODE` for every folder it makes."""
    p = Path(path)
    if p.is_dir():
        return
    if not p.parent.is_dir():
        make_folders(p.parent)
    with contextlib.suppress(FileExistsError):
        os.mkdir(p, FOLDER_MODE)


@contextlib.contextmanager
def folder(path: str | os.PathLike[str], *, create: bool = False) -> Iterator[int]:
    """A held descriptor of the folder ``path`` (the last component never a link), made when
    missing with ``create``."""
    p = Path(path)
    if create:
        make_folders(p.parent)
    parent = os.open(p.parent, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    try:
        fd = make_folder(p.name, parent) if create else open_dir(p.name, dir_fd=parent)
    finally:
        os.close(parent)
    try:
        yield fd
    finally:
        os.close(fd)


def open_at(
    dir_fd: int,
    name: str,
    *,
    write: bool = False,
    create: bool = False,
    mode: int = 0o644,
    own: bool = False,
    cap: int = NO_CAP,
    path: str | os.PathLike[str] | None = None,
) -> tuple[int, os.stat_result]:
    """Open the file ``name`` in the held folder: the descriptor and its ``fstat``.

    Never blocks (``O_NONBLOCK``: a FIFO cannot hang the open), never follows a link
    (``O_NOFOLLOW``), and the opened file must be a regular file of at most ``cap`` bytes;
    with ``own`` (where the owner's own file is expected) it must also belong to this process's
    user and have one link (a hard link to another file of the owner's is refused).
    ``write`` opens it for writing, ``create`` makes it (mode ``mode`` less the umask, and
    never group-writable) when missing. Raises ``FileNotFoundError`` when missing and
    :class:`~ckptdash.errors.NotARegularFile` naming the file (``path``) and what it is.
    """
    shown = str(path if path is not None else name)
    flags = O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC
    flags |= os.O_RDWR if write else os.O_RDONLY
    if create:
        flags |= os.O_CREAT
    try:
        fd = os.open(name, flags, mode & ~OTHERS_WRITE, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotARegularFile(errno.ELOOP, "a symbolic link, not followed", shown) from None
        if exc.errno in (errno.ENXIO, errno.EISDIR):
            raise NotARegularFile(exc.errno, "not a regular file", shown) from None
        raise
    try:
        st = os.fstat(fd)
        why = _refused(st, own=own, cap=cap)
        if why:
            raise NotARegularFile(errno.EPERM, why, shown)
        if write and O_NONBLOCK:  # a regular file: plain blocking I/O from here on
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _refused(st: os.stat_result, *, own: bool, cap: int) -> str:

    if not stat.S_ISREG(st.st_mode):
        return f"{kind_of(st.st_mode)}, not a regular file"
    if st.st_size > cap:
        return f"{st.st_size} bytes, more than the {cap} it may hold"
    if own:
        me = os.geteuid()
        if st.st_uid != me:
            return f"owned by {user_name(st.st_uid)}, not by {user_name(me)}: not the run's own"
        if st.st_nlink != 1:
            return f"{st.st_nlink} links to one file: a hard link to another file, not the run's"
    return ""


def read_at(
    dir_fd: int,
    name: str,
    cap: int,
    *,
    own: bool = False,
    path: str | os.PathLike[str] | None = None,
) -> tuple[bytes, os.stat_result]:
    """The bytes of ``name`` in the held folder (checked as :func:`open_at` checks) and its
    ``fstat``; never more than ``cap`` bytes."""
    fd, st = open_at(dir_fd, name, own=own, cap=cap, path=path)
    with os.fdopen(fd, "rb") as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise NotARegularFile(errno.EFBIG, f"more than the {cap} bytes it may hold", str(path))
    return data, st


@contextlib.contextmanager
def open_path(
    path: str | os.PathLike[str], *, write: bool = False, own: bool = False, cap: int = NO_CAP
) -> Iterator[tuple[int, os.stat_result]]:
    """:func:`open_at` for a path: its folder opened first (the folder itself may be reached
    through the user's own links above it; the file never is)."""
    p = Path(path)
    parent = os.open(p.parent, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    try:
        fd, st = open_at(parent, p.name, write=write, own=own, cap=cap, path=p)
    finally:
        os.close(parent)
    try:
        yield fd, st
    finally:
        os.close(fd)


def read_path(path: str | os.PathLike[str], cap: int, *, own: bool = False) -> bytes:
    """The bytes of the file at ``path``, opened as :func:`open_path` opens it."""
    with open_path(path, own=own, cap=cap) as (fd, _), os.fdopen(os.dup(fd), "rb") as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise NotARegularFile(errno.EFBIG, f"more than the {cap} bytes it may hold", str(path))
    return data


def fsync_saved(path: str | os.PathLike[str]) -> None:
    """Fsync a file someone else's code saved (a user's ``CheckpointIO``): opened non-blocking
    and checked by ``fstat`` to be a regular file, so a FIFO or a device in its place never
    hangs the save (:class:`~ckptdash.errors.NotARegularFile` says what it is). A link is
    followed: Lightning's ``save_last="link"`` makes ``last.ckpt`` one, and the checksum that
    follows reads through it too; its target is only fsync'ed and hashed, never written."""

    fd, _ = open_regular(path, follow_symlinks=True)
    try:
        os.fsync(fd)
    except OSError:
        pass  # read-only descriptors cannot fsync on some filesystems; the data is written
    finally:
        os.close(fd)
