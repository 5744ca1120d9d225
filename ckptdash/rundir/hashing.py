"""Checksums of checkpoint files: computed while a file is written, or read back from disk.

Every checksum has the form ``xxh3_128:<hex>`` (docs/format.md), whichever way it was made,
so a size and checksum recorded at save time can be compared with the file's later.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any, Final, Protocol

import xxhash

from ckptdash.rundir.safe_read import open_regular

CHECKSUM_ALGO: Final = "xxh3_128"


# Chunks this big are hashed on a helper thread while this thread writes them: both release
# the GIL, so the checksum costs next to nothing on a second core. Smaller ones (the pickle,
# the zip records) are hashed inline, where a thread handoff would cost more than the hash.
_PARALLEL_HASH_MIN: Final = 4 << 20


class ByteSink(Protocol):
    """What :class:`HashingWriter` writes to: a binary file, or a ``DirectFile``."""

    def write(self, data: memoryview, /) -> int | None: ...

    def flush(self) -> None: ...


class HashingWriter:
    """A write-only file wrapper that hashes and counts bytes as they pass (no second read).

    Each call returns only once its bytes are both written and hashed, so the
    caller may reuse its buffer and the hash sees the chunks in order.
    """

    def __init__(self, raw: ByteSink) -> None:
        self._raw = raw
        self._hash = xxhash.xxh3_128()
        self._helper: _HashHelper | None = None
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data)
        if view.nbytes >= _PARALLEL_HASH_MIN and view.c_contiguous:
            if self._helper is None:
                self._helper = _HashHelper(self._hash)
            hashed = self._helper.start(view)
            try:
                n = self._raw.write(view)
            finally:
                hashed.wait()
            self._helper.check()
        else:
            self._hash.update(view)
            n = self._raw.write(view)
        self.size += view.nbytes if n is None else n
        return view.nbytes

    def flush(self) -> None:
        self._raw.flush()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        # Seeking back would invalidate the running hash, so we say we cannot.
        return False

    def close(self) -> None:
        """Stop the helper thread (the file itself is the caller's)."""
        if self._helper is not None:
            self._helper.stop()
            self._helper = None

    @property
    def checksum(self) -> str:
        return f"{CHECKSUM_ALGO}:{self._hash.hexdigest()}"


class _HashHelper:
    """One thread that feeds chunks to a hash, one at a time; lives for one atomic write
    (a thread per write rather than a pool, which a forked child would inherit broken)."""

    def __init__(self, hash_: Any) -> None:
        self._hash = hash_
        self._todo: queue.SimpleQueue[tuple[memoryview, threading.Event] | None] = (
            queue.SimpleQueue()
        )
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ckptdash-hash", daemon=True)
        self._thread.start()

    def start(self, view: memoryview) -> threading.Event:
        done = threading.Event()
        self._todo.put((view, done))
        return done

    def check(self) -> None:
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        self._todo.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (item := self._todo.get()) is not None:
            view, done = item
            try:
                self._hash.update(view)
            except BaseException as exc:  # handed to the writing thread by check()
                self._error = exc
            finally:
                done.set()


def checksum_file(
    path: str | os.PathLike[str], chunk: int = 1 << 20, *, limit: int | None = None
) -> tuple[int, str]:
    """Size and checksum of a file on disk, in the same form :func:`atomic_write` reports.

    Only a regular file is read (a link is followed, but a FIFO or a device at its end is
    refused with :class:`~ckptdash.errors.NotARegularFile`, never blocked on). With ``limit``
    (the size a record names) at most ``limit + 1`` bytes are read: a longer file comes back
    with a size over the limit and is never read to its end.
    """
    fd, _st = open_regular(path, follow_symlinks=True)
    h = xxhash.xxh3_128()
    size = 0
    left = -1 if limit is None else limit + 1
    with os.fdopen(fd, "rb") as f:
        while left and (block := f.read(chunk if left < 0 else min(chunk, left))):
            h.update(block)
            size += len(block)
            left = left - len(block) if left > 0 else left
    return size, f"{CHECKSUM_ALGO}:{h.hexdigest()}"
