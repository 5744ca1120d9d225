"""The durable settings of a run: ``control/settings.json``, read fresh, replaced whole.

The file is small and replaced as a whole with :func:`~ckptdash.rundir.atomic_write` (readers
see the old file or the new one) and read fresh at every decision (:func:`read_settings` has
no cache), so a click just before a preemption signal still counts. Import these names from
:mod:`ckptdash.control`, the control channel's public module.
"""

from __future__ import annotations

import contextlib
import enum
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Final

import msgspec

from ckptdash.control.dirs import control_fd, write_at
from ckptdash.control.files import (
    FILE_MODE,
    PathArg,
    existing_run,
    read_small,
    run_of,
    user_at_host,
)
from ckptdash.errors import (
    AtomicWriteError,
    ControlError,
    MalformedControlFile,
    UnreadableControlFile,
)
from ckptdash.events import Settings, decode_settings, encode_settings
from ckptdash.rundir import SETTINGS_FILE, RunDir, door

if sys.platform != "win32":
    import fcntl

SETTINGS_LOCK: Final = "control/settings.lock"
SETTINGS_NAME: Final = SETTINGS_FILE.rsplit("/", 1)[1]
LOCK_NAME: Final = SETTINGS_LOCK.rsplit("/", 1)[1]
CRASH_LOOP_AUTHOR: Final = "ckptdash crash loop"
"""``updated_by`` of the requeue suspension a crash loop wrote
(``ckptdash.train.ending.crash_loop``): an action that answers the loop (a pin, a fresh start)
lifts only a suspension with this author; one that someone set by hand stays."""
_HOW_TO_FIX_SETTINGS: Final = "remove it and set the settings again (control.update_settings())"


class _Unset(enum.Enum):
    UNSET = enum.auto()


UNSET: Final = _Unset.UNSET
"""Default of :func:`update_settings` arguments: leave that setting as it is."""


def read_settings(run_dir: PathArg) -> Settings:
    """The run's settings, read from disk now (no cache); defaults when there is no file yet.

    Raises :class:`MalformedControlFile` naming the file and the fix when it
    exists but does not parse — a policy must never silently fall back.
    """
    rd = run_of(run_dir)
    path = rd.settings
    try:
        # Never through a symbolic link, the file's or control/'s: whoever can write the
        # run directory would otherwise point the policy at a file of their choosing.
        with control_fd(rd) as control:
            data = read_small(path, _HOW_TO_FIX_SETTINGS, follow_symlinks=False, dir_fd=control)
    except FileNotFoundError:
        return Settings()
    except MalformedControlFile:
        raise
    except ControlError as exc:  # control/ itself is a link
        raise MalformedControlFile(f"{exc}. {_HOW_TO_FIX_SETTINGS}") from None
    except OSError as exc:
        raise UnreadableControlFile(
            f"{path}: cannot read it ({exc.strerror}); check the permissions of {path.parent}"
        ) from None
    return decode_settings(data, str(path))


def update_settings(
    run_dir: PathArg,
    *,
    requeue_suspended: bool | None = None,
    resume_pin: str | _Unset | None = UNSET,
    sticky: bool = False,
    fresh_start: bool | None = None,
    health: dict[str, float] | None = None,
    group_steering: bool | None = None,
    author: str | None = None,
    now: float | None = None,
) -> Settings:
    """Change some settings, keep the others, and return the new settings.

    ``requeue_suspended=None`` and ``resume_pin=UNSET`` leave that setting as
    it is; ``resume_pin=None`` clears the pin. A new pin is used once (the attempt that loads
    it consumes it) unless ``sticky``. ``fresh_start=True`` asks the next attempt to start
    fresh (and clears the pin); ``None`` leaves that request as it is. ``group_steering=True``
    lets the project group send commands: the owner's next attempt opens
    ``control/group-inbox/`` to the group (``False`` closes it; only the run's owner can write
    this file, and the job honours it only in the owner's own file). ``author`` is recorded as
    ``updated_by`` (default ``user@host``). The file is read, changed and
    replaced atomically under a lock, so two dashboards changing different
    settings at once do not undo each other. An existing file that does not
    parse is left alone and :class:`MalformedControlFile` is raised.

    >>> update_settings("runs/exp1", requeue_suspended=True).requeue_suspended
    True
    >>> update_settings("runs/exp1", resume_pin="checkpoints/step=1200.ckpt").resume_pin
    'checkpoints/step=1200.ckpt'
    """
    if requeue_suspended is not None and not isinstance(requeue_suspended, bool):
        raise ControlError(f"requeue_suspended={requeue_suspended!r}: must be True or False")
    if isinstance(resume_pin, str) and not resume_pin:
        raise ControlError("resume_pin='': must be a checkpoint path, or None to clear the pin")
    if resume_pin is not UNSET and resume_pin is not None and not isinstance(resume_pin, str):
        raise ControlError(
            f"resume_pin={resume_pin!r}: must be a checkpoint path, or None to clear the pin"
        )
    if author is None:
        author = user_at_host()
    rd = existing_run(run_dir)
    # Every write relative to the held control/ folder: a Suspend click never writes through
    # a control/ that someone swapped for a link to another run's (or anyone's) folder.
    with control_fd(rd, create=True) as control, _settings_lock(rd, control):
        current = read_settings(rd)
        changes: dict[str, object] = {
            "updated_at": time.time() if now is None else now,
            "updated_by": author,
        }
        if requeue_suspended is not None:
            changes["requeue_suspended"] = requeue_suspended
        if resume_pin is not UNSET:
            changes["resume_pin"] = resume_pin
            changes["resume_pin_sticky"] = bool(sticky and resume_pin is not None)
            if resume_pin is not None:
                changes["fresh_start"] = False  # the latest request wins
        if fresh_start is not None:
            changes["fresh_start"] = bool(fresh_start)
            if fresh_start:
                changes["resume_pin"], changes["resume_pin_sticky"] = None, False
        if group_steering is not None:
            changes["group_steering"] = bool(group_steering)
        if health is not None:  # the whole mapping: the caller merged and validated it
            changes["health"] = dict(sorted(health.items()))
        new = msgspec.structs.replace(current, **changes)
        data = encode_settings(new)
        try:  # strict writer: never leave a file that read_settings() would refuse
            decode_settings(data, str(rd.settings))
        except MalformedControlFile as exc:
            raise ControlError(f"refusing to write these settings: {exc}") from None
        try:
            write_at(control, SETTINGS_NAME, data, mode=FILE_MODE)
        except OSError as exc:
            raise AtomicWriteError(
                exc.errno,
                f"cannot write {rd.settings} ({exc.strerror}); the previous settings are intact;"
                f" check that you can write to {rd.settings.parent}",
                str(rd.settings),
            ) from None
    return new


# flock locks belong to an open file, but where the kernel emulates them with
# POSIX locks (NFS) they belong to the process, so threads of one process also
# take this lock.
_process_settings_lock = threading.Lock()


@contextlib.contextmanager
def _settings_lock(rd: RunDir, control: int) -> Iterator[None]:
    """Serialise read-modify-write of the settings between processes and hosts, best effort.

    ``flock`` excludes processes on one host everywhere, and across hosts on
    NFSv4, on NFSv3 with a lock daemon, and on Lustre mounted with ``-o flock``.
    Where the filesystem has no locks (NFS ``nolock``, Lustre without ``flock``
    or with ``localflock``) two simultaneous updates from different hosts can
    still lose one; the file itself is never torn either way.
    """
    lock_path = rd.root / SETTINGS_LOCK
    with _process_settings_lock:
        try:
            # The one door: a FIFO or a link in its place is refused, never waited on.
            fd, _ = door.open_at(
                control, LOCK_NAME, write=True, create=True, mode=FILE_MODE, path=lock_path
            )
        except OSError as exc:
            raise ControlError(
                f"{lock_path}: cannot open the settings lock ({exc.strerror}); check that you"
                f" can write to {lock_path.parent}"
            ) from exc
        try:
            if sys.platform != "win32":
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                except OSError as exc:
                    warnings.warn(
                        f"{lock_path}: the filesystem refuses locks ({exc.strerror}); settings"
                        " changed from two places at the same moment may overwrite each other",
                        RuntimeWarning,
                        stacklevel=4,
                    )
            yield
        finally:
            os.close(fd)  # releases the flock
