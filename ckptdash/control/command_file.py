"""One command file: its name (``<id>.json``), its bytes, its checks, its age.

The claimer (rank 0), the tailer and the dashboard read a command file with these same rules,
so a file shown as pending is one the job would take, and a malformed one is named the same
way by all of them. Import these names from :mod:`ckptdash.control`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final

from ckptdash.control.files import read_small
from ckptdash.errors import MalformedControlFile
from ckptdash.events import Command, decode_command
from ckptdash.rundir import is_temp_file

COMMAND_SUFFIX: Final = ".json"

MAX_TTL_S: Final = 86400.0
"""The longest any command waits: one issued without expiry (``expires_at: null``) or with a
later one expires this long after its issue time, so a stale click cannot fire days later."""

_ID_RE: Final = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # the pattern of Command.id
_HOW_TO_ISSUE: Final = "create commands with `ckptdash save` / `ckptdash stop` (or control.issue())"
# NFS "silly-renames" a file that is deleted while open to .nfsXXXX; it is not ours to claim.
_NFS_SILLY_PREFIX: Final = ".nfs"


def _listing(directory: Path) -> list[str]:
    """Names in ``directory`` that may be commands, sorted (ids sort by creation time)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if not is_not_a_command(n))


def is_not_a_command(name: str) -> bool:
    """Names in the control folders that are nobody's command: temp files, NFS leftovers."""
    return is_temp_file(name) or name.startswith(_NFS_SILLY_PREFIX)


def _id_of(name: str) -> str:
    stem = name.removesuffix(COMMAND_SUFFIX)
    return safe_name(stem or name)


def _is_command_name(name: str) -> bool:
    return name.endswith(COMMAND_SUFFIX) and _ID_RE.match(name[: -len(COMMAND_SUFFIX)]) is not None


def safe_name(name: str) -> str:
    """``name`` as printable text: bytes that are not UTF-8 and control characters (an
    ANSI escape) become ``\\xNN`` escapes. A file name is any bytes; an event holds text.

    >>> safe_name(os.fsdecode(b"\\xff\\x1b[2J.json"))
    '\\\\xff\\\\x1b[2J.json'
    """
    text = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def read_command(path: Path, *, dir_fd: int | None = None) -> Command:
    """Read and check one command file: the same rules for the claimer and the dashboard.

    Raises :class:`MalformedControlFile` saying what is wrong and how to issue a
    command properly (:class:`UnreadableControlFile` when it may be readable
    later), or ``FileNotFoundError`` when the file moved or vanished. ``dir_fd``: read
    ``path.name`` in that held folder.
    """
    return _check_command(
        path, read_small(path, _HOW_TO_ISSUE, follow_symlinks=False, dir_fd=dir_fd)
    )


def _check_command(path: Path, data: bytes) -> Command:
    file_id = _id_of(path.name)
    if not path.name.endswith(COMMAND_SUFFIX) or not _ID_RE.match(file_id):
        raise MalformedControlFile(
            f"{path}: command files are named <id>{COMMAND_SUFFIX} with the id inside;"
            f" {_HOW_TO_ISSUE}"
        )
    cmd = decode_command(data, str(path))
    if cmd.id != file_id:
        raise MalformedControlFile(
            f"{path}: holds command id {cmd.id!r} but is named after {file_id!r}; {_HOW_TO_ISSUE}"
        )
    return cmd


def author_user(author: str) -> str:
    """The account name an author string starts with: ``alice`` of ``alice@login1 (dashboard)``."""
    return author.split("@", 1)[0].split(" ", 1)[0]


def expired(cmd: Command, now: float) -> bool:
    """Whether ``cmd`` is too old to apply at ``now``: past its ``expires_at``, or more than
    :data:`MAX_TTL_S` after its issue time whatever ``expires_at`` says, or issued so far in
    the future that the issuer's clock cannot be right."""
    deadline = cmd.t + MAX_TTL_S
    if cmd.expires_at is not None:
        deadline = min(deadline, cmd.expires_at)
    return now > deadline or cmd.t > now + MAX_TTL_S
