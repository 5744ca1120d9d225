"""One inotify instance and one thread for every folder a follower watches (Linux).

watchdog gives each watched folder an emitter thread and an inotify instance of its own: a
served folder of 250 live runs (three folders each) asked for 750 threads and instances, and
under a login node's limits (128 inotify instances, a process limit) the first refused
thread failed every poll (issue 35). Here the number of threads is one per follower, and the
number of inotify instances one, whatever the number of runs; a folder that cannot be
watched (``ENOSPC``: out of watches) is refused alone, and the follower polls it.

The binding is the three system calls, through ``ctypes``; where they do not exist (not
Linux) :class:`Watches` raises ``OSError`` at start and the follower polls.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import select
import struct
import threading
from collections.abc import Callable
from typing import Final

log = logging.getLogger(__name__)

IN_MODIFY: Final = 0x002
IN_ATTRIB: Final = 0x004
IN_CLOSE_WRITE: Final = 0x008
IN_MOVED_FROM: Final = 0x040
IN_MOVED_TO: Final = 0x080
IN_CREATE: Final = 0x100
IN_DELETE: Final = 0x200
IN_DELETE_SELF: Final = 0x400
IN_MOVE_SELF: Final = 0x800
IN_Q_OVERFLOW: Final = 0x4000
IN_IGNORED: Final = 0x8000
IN_ONLYDIR: Final = 0x01000000
IN_NONBLOCK: Final = os.O_NONBLOCK
IN_CLOEXEC: Final = os.O_CLOEXEC

CHANGES: Final = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
)
"""Only changes: opening or reading a file (the follower's own tailer does both) wakes nobody."""

_HEADER: Final = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event)
_READ_BYTES: Final = 64 << 10


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    for name in ("inotify_init1", "inotify_add_watch", "inotify_rm_watch"):
        if not hasattr(libc, name):
            raise OSError(errno.ENOSYS, "inotify is not available on this system")
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    return libc


def _failed(what: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{what}: {os.strerror(code)}")


class Watches:
    """Folders watched through one inotify instance; ``note(path)`` is called, in the one
    reader thread, with the path of each change (the folder itself when the change has no
    name, e.g. a queue overflow: ``note(root)``).

    :meth:`start` raises ``OSError`` (no inotify, instances exhausted) or ``RuntimeError``
    (no thread can be started); :meth:`add` raises ``OSError`` for a folder that cannot be
    watched. Neither leaves anything running behind.
    """

    def __init__(self, root: str, note: Callable[[str], None], *, name: str) -> None:
        self._root = root
        self._note = note
        self._name = name
        self._lock = threading.Lock()  # guards the two maps: the worker adds, the reader drops
        self._folders: dict[int, str] = {}  # watch descriptor -> folder
        self._wds: dict[str, int] = {}
        self._fd = -1
        self._stop_r = self._stop_w = -1
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        libc = _libc()
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            raise _failed("inotify_init1")
        self._libc, self._fd = libc, fd
        try:
            self._stop_r, self._stop_w = os.pipe()
            thread = threading.Thread(target=self._read_forever, name=self._name, daemon=True)
            thread.start()
        except BaseException:
            self._close_fds()
            raise
        self._thread = thread

    def add(self, folder: str) -> None:
        """Watch ``folder`` (not what lies below it); nothing when it is watched already."""
        with self._lock:
            if folder in self._wds or self._fd < 0:
                return
            wd = self._libc.inotify_add_watch(self._fd, os.fsencode(folder), CHANGES | IN_ONLYDIR)
            if wd < 0:
                raise _failed(f"inotify_add_watch {folder}")
            self._wds[folder] = wd
            self._folders[wd] = folder

    def remove(self, folder: str) -> None:
        """Stop watching ``folder`` (nothing when it is not watched, or gone already)."""
        with self._lock:
            wd = self._wds.pop(folder, None)
            if wd is None or self._fd < 0:
                return
            self._folders.pop(wd, None)
            self._libc.inotify_rm_watch(self._fd, wd)  # EINVAL when the folder is gone: fine

    def watching(self, folder: str) -> bool:
        with self._lock:
            return folder in self._wds

    def __len__(self) -> int:
        with self._lock:
            return len(self._wds)

    def stop(self, timeout: float) -> None:
        if self._thread is None:
            self._close_fds()
            return
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")
        self._thread.join(timeout)
        self._thread = None
        self._close_fds()

    def _close_fds(self) -> None:
        with self._lock:
            for fd in (self._fd, self._stop_r, self._stop_w):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self._fd = self._stop_r = self._stop_w = -1
            self._folders.clear()
            self._wds.clear()

    def _read_forever(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._stop_r in ready:
                return
            try:
                data = os.read(self._fd, _READ_BYTES)
            except BlockingIOError:
                continue
            except OSError:
                return  # the instance is gone: the follower's safety poll goes on
            self._dispatch(data)

    def _dispatch(self, data: bytes) -> None:
        at = 0
        while at + _HEADER.size <= len(data):
            wd, mask, _, size = _HEADER.unpack_from(data, at)
            name = data[at + _HEADER.size : at + _HEADER.size + size].rstrip(b"\0")
            at += _HEADER.size + size
            if mask & IN_Q_OVERFLOW:
                self._call(self._root)  # events were lost: the follower reads everything
                continue
            with self._lock:
                folder = self._folders.get(wd)
                if mask & IN_IGNORED and folder is not None:  # removed, or the folder is gone
                    self._folders.pop(wd, None)
                    if self._wds.get(folder) == wd:
                        del self._wds[folder]
            if folder is not None:
                self._call(os.path.join(folder, os.fsdecode(name)) if name else folder)

    def _call(self, path: str) -> None:
        try:
            self._note(path)
        except Exception:  # the reader outlives a bad callback, as the follower does
            log.exception("ckptdash: a change note failed")
