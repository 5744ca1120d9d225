"""The control channel: one-shot commands and durable settings, as files in the run directory.

A command lives its whole life as one file, ``<id>.json``, that only ever moves::

    dashboard/CLI                   training side (rank 0)
    ─────────────                   ──────────────────────
    issue()  ──> control/inbox/ ──claim()──> control/claimed/ ──complete()──> control/done/
                                     │                            ▲
                                     └─> outcome event ───────────┘
                                         (command_received, then applied / rejected / expired)

Why each command is applied at most once, on local disks, NFS and Lustre alike:

* :func:`issue` writes the file under a temp name and links it into the inbox,
  so a claimer never sees it empty or half-written.
* The claim *is* ``rename(inbox/x, claimed/x)``: the filesystem lets exactly
  one caller succeed; every other claimer gets ``FileNotFoundError`` and skips
  the file. Nothing else is needed to agree on who owns a command.
* The caller writes the outcome event (fsync'ed) *before* :func:`complete`
  moves the file to ``done/``. A claimer that dies in between leaves the file
  in ``claimed/``: an *orphan*. The next attempt calls :func:`orphans` before
  it claims anything and answers each one with ``command_expired`` — a
  command is never applied twice, and never left without an answer.
* Nothing is dropped: a file that does not parse is still claimed and comes
  back with ``error`` set, so the caller answers ``command_rejected`` saying why.

Settings are a single small file, ``control/settings.json``, replaced as a
whole with :func:`~ckptdash.rundir.atomic_write` (readers see the old file
or the new one) and read fresh at every decision (:func:`read_settings` has no
cache), so a click just before a preemption signal still counts.

>>> cmd = issue("runs/exp1", "save_now")
>>> [c.command for c in claim("runs/exp1")]    # doctest: +ELLIPSIS
[SaveNow(v=1, id='...', ...)]
"""

from __future__ import annotations

import math
import os
import secrets
import socket
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ckptdash.control.command_file import (
    _HOW_TO_ISSUE,
    COMMAND_SUFFIX,
    MAX_TTL_S,
    _check_command,
    _id_of,
    _is_command_name,
    _listing,
    author_user,
    expired,
    is_not_a_command,
    read_command,
    safe_name,
)
from ckptdash.control.dirs import (
    InboxScan,
    control_fd,
    fsync_fd,
    job_folder,
    regular_files,
    user_name,
)
from ckptdash.control.files import (
    FILE_MODE,
    MAX_CONTROL_FILE_BYTES,
    PathArg,
    default_author,
    existing_run,
    read_small_stat,
    run_of,
    user_at_host,
)
from ckptdash.control.settings import SETTINGS_LOCK, UNSET, read_settings, update_settings
from ckptdash.errors import ControlError, MalformedControlFile, NotARegularFile
from ckptdash.events import (
    COMMAND_TYPES,
    COMMANDS,
    Command,
    encode_command,
)
from ckptdash.rundir import RunDir, create_exclusive
from ckptdash.rundir.door import GROUP_INBOX
from ckptdash.rundir.safe_read import open_dir

# The settings and the files' limits live in their own modules; this one is the channel's
# public face (docs/format.md names it for commands and settings), so it re-exports them.
__all__ = [
    "CLAIM_BATCH",
    "COMMAND_SUFFIX",
    "DEFAULT_TTL_S",
    "FILE_MODE",
    "MAX_CONTROL_FILE_BYTES",
    "MAX_TTL_S",
    "SETTINGS_LOCK",
    "UNSET",
    "Claimed",
    "InboxScan",
    "MalformedControlFile",
    "PathArg",
    "author_user",
    "claim",
    "complete",
    "expired",
    "is_not_a_command",
    "issue",
    "orphans",
    "pending",
    "read_command",
    "read_settings",
    "safe_name",
    "update_settings",
    "user_at_host",
]

DEFAULT_TTL_S: Final = 600.0
"""How long a command from the CLI or the dashboard waits to be applied, by default."""
CLAIM_BATCH: Final = 16
"""Most inbox files one :func:`claim` takes; the rest wait for the next check. Each costs a
rename and two fsync'ed events, so 2,000 junk files would otherwise stall one step for seconds."""


# --- commands --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Claimed:
    """One command file this process now owns, taken from the inbox or found orphaned.

    ``command`` is the parsed command, or ``None`` when the file did not parse —
    then ``error`` says which file and why, and the caller answers
    ``command_rejected``. ``expired`` is true when ``expires_at`` has passed;
    the caller answers ``command_expired`` instead of acting. Either way the
    caller then calls :func:`complete` with this object.
    """

    id: str
    path: Path
    command: Command | None
    error: str | None = None
    expired: bool = False
    owner: str = ""
    """The account that owns the file (from ``fstat`` of the file read), ``""`` when it could
    not be read: recorded next to the author the file claims, which anyone can write."""

    @property
    def spoofed(self) -> bool:
        """Whether the author the file names is not the account that wrote it."""
        if self.command is None or not self.owner:
            return False
        return author_user(self.command.author) != self.owner

    @property
    def command_name(self) -> str:
        """``save_now``, ``stop_after_save``…, or ``""`` for a file that did not parse."""
        return self.command.NAME if self.command is not None else ""


def issue(
    run_dir: PathArg,
    command: type[Command] | str,
    *,
    author: str | None = None,
    host: str | None = None,
    ttl_s: float | None = DEFAULT_TTL_S,
    now: float | None = None,
) -> Command:
    """Put a new command in the run's inbox and return it.

    ``command`` is a command class (:class:`~ckptdash.events.SaveNow`) or its
    name (``"save_now"``). The id is unique and sorts by creation time. The
    command expires ``ttl_s`` seconds from now (``None``: after :data:`MAX_TTL_S`,
    the longest any command waits). The file is created complete and owner-only
    (mode 0600); an existing file is never replaced.

    Raises :class:`RunDirError` if ``run_dir`` is not a run (nothing is
    created then), :class:`ControlError` for an unknown command, a bad ttl or
    a file that cannot be written, and
    :class:`~ckptdash.errors.EventValidationError` for fields the schema
    refuses (a negative ``now``).

    >>> issue("runs/exp1", "stop_after_save", ttl_s=300)  # doctest: +ELLIPSIS
    StopAfterSave(v=1, id='...', ...)
    """
    cls = _command_class(command)
    if ttl_s is not None and not (math.isfinite(ttl_s) and ttl_s > 0):
        raise ControlError(f"ttl_s={ttl_s!r}: must be a positive number of seconds, or None")
    rd = existing_run(run_dir)
    if now is None:
        ns = time.time_ns()
        t = ns / 1e9
    else:
        ns, t = round(now * 1e9), now
    _check_inbox(rd)
    inbox = rd.inbox
    for _ in range(4):  # a collision needs the same nanosecond *and* 32 random bits
        cmd = cls(
            id=f"{ns:020d}-{secrets.token_hex(4)}",
            t=t,
            author=default_author() if author is None else author,
            host=socket.gethostname() if host is None else host,
            expires_at=None if ttl_s is None else t + ttl_s,
        )
        target = inbox / f"{cmd.id}{COMMAND_SUFFIX}"
        data = encode_command(cmd)
        try:
            # In the group inbox the owner's job (same group) must read it: 0640.
            mode = FILE_MODE if inbox == rd.inbox else 0o640
            if create_exclusive(target, data, mode=mode):
                return cmd
        except PermissionError as exc:
            if inbox != rd.inbox:
                raise ControlError(f"{target}: cannot create the command file ({exc})") from exc
            inbox = _group_inbox(rd)  # not the owner: the group's inbox, when opened to it
        except OSError as exc:
            raise ControlError(
                f"{target}: cannot create the command file ({exc.strerror}); check that you can"
                f" write to {rd.inbox}"
            ) from exc
    raise ControlError(f"{rd.inbox}: could not pick an unused command id; try again")


def claim(
    run_dir: PathArg,
    *,
    now: float | None = None,
    limit: int = CLAIM_BATCH,
    on_problem: Callable[[str], object] | None = None,
    scan: InboxScan | None = None,
    folder: str = "inbox",
) -> list[Claimed]:
    """Take up to ``limit`` commands from the inbox, oldest first; each file goes to exactly
    one caller. The rest wait for the next call.

    Call it on one process per run (rank 0). Only regular files named ``<id>.json`` are
    claimed: a folder, a link, a FIFO, a temp file or any other name (``.bashrc``) is left
    where it is (the dashboard shows it as malformed). Files another claimer took first are
    skipped. A command-shaped file that does not parse is claimed too and comes back with
    ``error`` set — none is dropped. The moves are durable before this returns, so the
    caller may act on them. A file that cannot be moved (permissions) stays pending, with a
    :class:`RuntimeWarning` naming it (or a call of ``on_problem`` with that message).

    The folders are used through held descriptors, never through a symbolic link, and only
    when this process's user owns them (:mod:`ckptdash.control.dirs`); otherwise
    :class:`ControlError` says which folder and why, and nothing moves. ``scan`` keeps the
    listing's place between calls (the job's: each call then lists for a few ms at most);
    without it one call lists the whole inbox. ``folder``: ``"group-inbox"`` claims from the
    group's inbox of a run whose owner opted in to group steering (``Settings.group_steering``).

    >>> for c in claim(run.root):  # doctest: +SKIP
    ...     writer.emit(CommandReceived, command_id=c.id, command=c.command_name)
    """
    rd = run_of(run_dir)
    try:
        inbox = job_folder(rd, folder)
    except FileNotFoundError:
        return []
    try:
        names = (scan or InboxScan(math.inf)).take(inbox, limit, _is_command_name)
        if not names:
            return []
        claimed = _job_folder_or_error(rd, "claimed")
        try:
            taken = [n for n in names if _claim_one(rd, inbox, claimed, n, on_problem)]
            if taken:
                fsync_fd(claimed)
                fsync_fd(inbox)
            t = time.time() if now is None else now
            return [_parse(claimed, rd.claimed / name, t) for name in taken]
        finally:
            os.close(claimed)
    finally:
        os.close(inbox)


def _group_inbox(rd: RunDir) -> Path:
    """``control/group-inbox`` for a group member's command, or why there is none."""
    folder = rd.root / GROUP_INBOX
    if not os.path.isdir(folder) or os.path.islink(folder) or not os.access(folder, os.W_OK):
        raise ControlError(
            f"{rd.inbox}: the run's inbox is its owner's alone; to let the project group send"
            " commands the owner runs control.update_settings(RUN, group_steering=True) (see"
            " docs/security.md), and the next attempt opens control/group-inbox to the group"
        )
    return folder


def _check_inbox(rd: RunDir) -> None:
    """Make sure control/inbox exists and neither it nor control/ is a symbolic link: a click
    must not drop a command file into a folder someone pointed elsewhere."""
    try:
        with control_fd(rd, create=True) as control_dir:
            os.close(open_dir("inbox", dir_fd=control_dir, create=True))
    except NotARegularFile as exc:
        raise ControlError(
            f"{rd.inbox}: {exc.strerror}; refusing to put a command there. Remove it: the job"
            " recreates the folder"
        ) from None
    except OSError as exc:
        raise ControlError(
            f"{rd.inbox}: cannot create the folder ({exc.strerror}); check the run directory's"
            " permissions"
        ) from None


def _claim_one(
    rd: RunDir, inbox: int, claimed: int, name: str, on_problem: Callable[[str], object] | None
) -> bool:
    """``rename(inbox/name, claimed/name)`` relative to the held folders; True if we won."""
    try:
        os.rename(name, name, src_dir_fd=inbox, dst_dir_fd=claimed)
    except FileNotFoundError:
        # Another claimer won. (On NFS a retransmitted RENAME can also report
        # ENOENT for a rename that did happen: the file then waits in
        # claimed/ as an orphan and is answered command_expired, never applied twice.)
        return False
    except OSError as exc:
        problem = (
            f"{safe_name(str(rd.inbox / name))}: cannot claim it ({exc.strerror}); it stays"
            f" pending until it can be moved to {rd.claimed}: check both folders'"
            " permissions and that nothing of that name is in the way"
        )
        if on_problem is not None:
            on_problem(problem)
        else:
            warnings.warn(problem, RuntimeWarning, stacklevel=3)
        return False
    return True


def _job_folder_or_error(rd: RunDir, name: str) -> int:
    try:
        return job_folder(rd, name, create=True)
    except ControlError:
        raise
    except OSError as exc:
        raise ControlError(
            f"{rd.root / 'control' / name}: cannot open the folder ({exc.strerror}); check the"
            " run directory's permissions"
        ) from None


def complete(run_dir: PathArg, command: Claimed | str) -> None:
    """Move a claimed command to ``done/`` once its outcome event is written. Idempotent.

    ``command`` is what :func:`claim` or :func:`orphans` returned (this works
    for every file, whatever its name) or a command id (the file ``<id>.json``).
    Raises :class:`ControlError` naming the file and the fix when the move fails
    (``done/`` not writable, a directory in the way, a folder that is a link or another
    account's): the caller reports it and trains on.
    """
    rd = run_of(run_dir)
    name = command.path.name if isinstance(command, Claimed) else f"{command}{COMMAND_SUFFIX}"
    if not name or os.sep in name or name in (".", ".."):
        raise ControlError(f"{name!r}: not a command file name; pass what claim() returned")
    try:
        claimed = job_folder(rd, "claimed")
    except FileNotFoundError:
        return  # never claimed
    try:
        done = _job_folder_or_error(rd, "done")
        try:
            os.rename(name, name, src_dir_fd=claimed, dst_dir_fd=done)
        except FileNotFoundError:
            return  # already done, or never claimed
        except OSError as exc:
            raise ControlError(
                f"{safe_name(str(rd.claimed / name))}: cannot move it to {rd.done}"
                f" ({exc.strerror}); it stays in claimed/ and is never applied again. Fix the"
                " permissions of both folders and remove what is in the way"
            ) from None
        else:
            fsync_fd(done)
            fsync_fd(claimed)
        finally:
            os.close(done)
    finally:
        os.close(claimed)


def orphans(run_dir: PathArg, *, now: float | None = None) -> list[Claimed]:
    """Commands a previous claimer took but never completed (it died in between).

    Call this at the start of an attempt, before the first :func:`claim`, while
    no other claimer of the run is alive; answer each with ``command_expired``
    and :func:`complete` it. Only regular files named ``<id>.json`` count; they are parsed
    as :func:`claim` parses them. Raises :class:`ControlError` when ``claimed/`` is a link or
    another account's folder.
    """
    rd = run_of(run_dir)
    t = time.time() if now is None else now
    try:
        claimed = job_folder(rd, "claimed")
    except FileNotFoundError:
        return []
    try:
        names = [n for n in regular_files(claimed) if _is_command_name(n)]
        return [_parse(claimed, rd.claimed / name, t) for name in names]
    finally:
        os.close(claimed)


def pending(run_dir: PathArg) -> list[str]:
    """Ids of the commands waiting in the inbox, oldest first (the dashboard's "pending")."""
    return [_id_of(name) for name in _listing(run_of(run_dir).inbox)]


def _command_class(command: type[Command] | str) -> type[Command]:
    if isinstance(command, str):
        try:
            return COMMANDS[command]
        except KeyError:
            known = ", ".join(sorted(COMMANDS))
            raise ControlError(f"unknown command {command!r}; use one of {known}") from None
    if command not in COMMAND_TYPES:
        known = ", ".join(sorted(COMMANDS))
        raise ControlError(f"{command!r} is not a command class; use one of {known}")
    return command


def _parse(dir_fd: int, path: Path, now: float) -> Claimed:
    """Read a command file this process owns (``path.name`` in the held folder ``dir_fd``);
    any problem becomes ``error``, never an exception. The file's owner is recorded."""
    file_id = _id_of(path.name)
    owner = ""
    try:
        data, st = read_small_stat(path, _HOW_TO_ISSUE, dir_fd=dir_fd)
        owner = user_name(st.st_uid)
        cmd = _check_command(path, data)
    except MalformedControlFile as exc:
        return Claimed(file_id, path, None, safe_name(str(exc)), owner=owner)
    except FileNotFoundError:
        return Claimed(
            file_id,
            path,
            None,
            f"{safe_name(str(path))}: vanished after it was claimed; nothing was done",
        )
    return Claimed(file_id, path, cmd, None, expired(cmd, now), owner=owner)
