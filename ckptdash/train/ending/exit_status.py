"""The process's exit status, asked for by a scheduler that reruns a job by it (Grid Engine:
a job that exits 99 is rerun).

:func:`request` makes the interpreter's normal exit end with that status instead of 0: an
``atexit`` handler, registered on the first request, flushes the standard streams and the
``logging`` handlers and ends the process with :func:`os._exit`. Registered late, it runs
before the ``atexit`` handlers registered earlier (``atexit`` runs them last-in first-out),
which therefore do not run; that is why it flushes ``logging`` itself. Non-daemon threads
have been joined by then (Python joins them before ``atexit``).

The status is a request, not an exit: training code after the attempt's end (a Lightning
``fit()`` returning, a ``with Monitor`` block ending) goes on as usual.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys

_requested: list[int] = []


def request(status: int | None) -> None:
    """End the process with ``status`` when the interpreter exits normally (the last request
    wins); None asks for nothing."""
    if status is None:
        return
    if not _requested:
        atexit.register(_exit)
    _requested.append(status)


def requested() -> int | None:
    """The status asked for, or None."""
    return _requested[-1] if _requested else None


def _exit() -> None:
    status = requested()
    if status is None:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    logging.shutdown()
    os._exit(status)
