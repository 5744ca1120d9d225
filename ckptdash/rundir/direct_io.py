"""Writing a large file around the page cache (``O_DIRECT``), for background persists.

A buffered write copies every byte into the page cache on the writer's CPU, and the
kernel's flusher threads spend more CPU writing the pages back; where training keeps every
core busy, that CPU is taken from training while a save persists in the background
(``benchmarks/async_save.py``). With ``O_DIRECT`` the device reads the bytes straight from
our buffer: what is left on the CPU is one copy into an aligned bounce buffer.

``O_DIRECT`` needs the memory address, the length and the file offset of each write aligned
to the device's logical block (512 B or 4 KiB). ``torch.save``'s stream is not aligned, so
the bytes are gathered in a page-aligned bounce buffer and written in whole buffers; the
tail that does not fill one is written after ``O_DIRECT`` is switched off (``fcntl``), and
the caller's ``fsync`` makes it durable with the rest. A filesystem that refuses
``O_DIRECT`` (at ``fcntl`` or at the first write) gets the same bytes the buffered way:
the file is identical either way, only the CPU spent on it differs.
"""

from __future__ import annotations

import errno
import mmap
import os
import sys
from typing import Final

if sys.platform != "win32":
    import fcntl

# Whole multiples of 4 KiB (the largest logical block in common use) and of the page size;
# large enough that one write keeps a network filesystem streaming.
BOUNCE_BYTES: Final = 4 << 20
_O_DIRECT: Final = getattr(os, "O_DIRECT", 0)  # 0 where there is none (macOS, Windows)


class DirectFile:
    """A write-only file object over ``fd`` that writes through ``O_DIRECT`` where it can.

    Owns ``fd`` (closed by :meth:`close`). :attr:`direct` says whether writes go around
    the page cache now: False from the start where the filesystem refuses, from the first
    refused write on, and after :meth:`flush` (the unaligned tail goes buffered).
    """

    def __init__(self, fd: int, *, bounce_bytes: int = BOUNCE_BYTES) -> None:
        if bounce_bytes <= 0 or bounce_bytes % mmap.PAGESIZE:
            raise ValueError(f"bounce_bytes = {bounce_bytes}: must be a multiple of the page size")
        self._fd = fd
        try:
            self._bounce = mmap.mmap(-1, bounce_bytes)  # page-aligned, as O_DIRECT needs
        except BaseException:
            os.close(fd)
            raise
        self._view = memoryview(self._bounce)
        self._filled = 0
        self.direct = _set_direct(fd, True)

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        size = self._view.nbytes
        done = 0
        while done < view.nbytes:
            n = min(size - self._filled, view.nbytes - done)
            self._view[self._filled : self._filled + n] = view[done : done + n]
            self._filled += n
            done += n
            if self._filled == size:
                self._drain()
        return view.nbytes

    def flush(self) -> None:
        """Write whatever the bounce buffer holds (the unaligned tail without ``O_DIRECT``)."""
        if self._filled and self.direct:
            self.direct = False
            _set_direct(self._fd, False)
        self._drain()

    def fileno(self) -> int:
        return self._fd

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        """Close the file descriptor; bytes not yet :meth:`flush`\\ ed are dropped."""
        if self._fd < 0:
            return
        try:
            self._view.release()
            self._bounce.close()
        except BufferError:
            pass  # a traceback still holds a slice of it (an error being raised): GC frees it
        finally:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __enter__(self) -> DirectFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _drain(self) -> None:
        done = 0
        while done < self._filled:
            try:
                done += os.write(self._fd, self._view[done : self._filled])
            except OSError as exc:
                if exc.errno != errno.EINVAL or not self.direct:
                    raise
                # The filesystem took the flag but not the write (an alignment it needs that
                # we do not meet): the rest goes the buffered way, nothing is lost.
                self.direct = False
                _set_direct(self._fd, False)
        self._filled = 0


def _set_direct(fd: int, on: bool) -> bool:
    """Switch ``O_DIRECT`` on or off for ``fd``; whether it is now on."""
    if not _O_DIRECT:
        return False
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    wanted = flags | _O_DIRECT if on else flags & ~_O_DIRECT
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, wanted)
    except OSError:  # EINVAL: this filesystem has no direct I/O
        return False
    return on
