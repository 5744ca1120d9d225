"""A process and everything it started, for tests that must not leave processes behind.

A launcher may start its children in sessions of their own (torchrun's agent does), so killing
the launcher's process group leaves them running: a hung launch killed that way once left two
DeepSpeed ranks waiting on a build lock for the rest of the machine's life.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def descendants(pid: int) -> set[int]:
    """Every process started by ``pid``, and by those, now (Linux /proc)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in found:
                    found.add(child)
                    todo.append(child)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and its descendants, whatever session each is in (the caller reaps
    ``pid``; the others, orphaned, are reaped by init)."""
    for each in (pid, *descendants(pid)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGKILL)
