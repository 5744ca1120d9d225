"""How a follower notices that a run's files changed: inotify, or polling.

Polling exists for NFS and Lustre, where a write from another host raises no inotify
event on this one. Polling is the tailer's own ``stat`` of each event file, which is
cheaper than watchdog's ``PollingObserver`` (that one snapshots the whole tree,
checkpoints included, only to make us stat the event files again). Even with inotify the
worker polls every ``refresh_s`` as a safety net.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final, TypeAlias

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver, ObservedWatch

from ckptdash.rundir import CONTROL_DIR, EVENTS_DIR, RunDir

log = logging.getLogger(__name__)

# Only changes: opening or reading a file (our own tailer does both) must not wake us.
_EVENT_FILTER: Final = [
    FileModifiedEvent,
    FileCreatedEvent,
    FileMovedEvent,
    FileDeletedEvent,
    DirCreatedEvent,
    DirMovedEvent,
    DirDeletedEvent,
]


class _Wake(FileSystemEventHandler):
    """Any change under a watched folder wakes the worker and says where it happened."""

    def __init__(self, note: Callable[[str], None]) -> None:
        self._note = note

    def on_any_event(self, event: FileSystemEvent) -> None:
        self._note(os.fsdecode(event.src_path))


class Polling:
    """Polling: the worker's timer, every ``interval_s``, and the tailer's ``stat`` of each
    event file; nothing to start or stop."""

    mode: Final = "poll"

    def __init__(self, reason: str, interval_s: float) -> None:
        self.reason = reason
        self.refresh_s = interval_s

    def start(self) -> None:
        pass

    def watch_run(self, rd: RunDir) -> None:
        pass

    def unwatch_run(self, rd: RunDir) -> None:
        pass

    def stop(self, timeout: float) -> None:
        pass

    def describe(self) -> str:
        return f"{self.reason}, every {self.refresh_s:g} s"


class Inotify:
    """inotify through a watchdog Observer: every change under a watched folder calls ``note``;
    the worker still polls every ``refresh_s`` as a safety net."""

    mode: Final = "inotify"

    def __init__(
        self, path: Path, reason: str, refresh_s: float, note: Callable[[str], None]
    ) -> None:
        self.path = path
        self.reason = reason
        self.refresh_s = refresh_s
        self._handler = _Wake(note)
        self._observer: BaseObserver | None = None
        self._watched: dict[str, ObservedWatch] = {}

    def start(self) -> None:
        """Start the observer and watch the path; OSError when inotify is unavailable."""
        observer = Observer()
        observer.daemon = True
        observer.start()
        self._observer = observer
        self._watch(str(self.path), recursive=False)

    def watch_run(self, rd: RunDir) -> None:
        """Add inotify watches as a run's folders appear: events/ and control/, never
        checkpoints/ (a big save writes millions of times)."""
        if self._observer is None:
            return
        wanted = [(str(rd.root), False), (str(rd.root / EVENTS_DIR), False)]
        wanted.append((str(rd.root / CONTROL_DIR), True))
        for folder, recursive in wanted:
            if folder not in self._watched and os.path.isdir(folder):
                watch = self._watch(folder, recursive=recursive)
                if watch is not None:
                    self._watched[folder] = watch

    def unwatch_run(self, rd: RunDir) -> None:
        """Drop a run's watches (a resting run, :mod:`ckptdash.dash.feed.resting`): watchdog
        runs a thread and an inotify instance per watched folder, and a user may have only 128
        instances; a resting run is looked at by its fingerprint instead."""
        if self._observer is None:
            return
        for folder in (str(rd.root), str(rd.root / EVENTS_DIR), str(rd.root / CONTROL_DIR)):
            watch = self._watched.pop(folder, None)
            if watch is not None:
                with contextlib.suppress(KeyError, OSError):  # its folder is gone already
                    self._observer.unschedule(watch)

    def stop(self, timeout: float) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout)
            self._observer = None

    def describe(self) -> str:
        return f"{self.reason}, checked every {self.refresh_s:g} s"

    def _watch(self, folder: str, *, recursive: bool) -> ObservedWatch | None:
        if self._observer is None:
            return None
        try:
            return self._observer.schedule(
                self._handler, folder, recursive=recursive, event_filter=_EVENT_FILTER
            )
        except OSError as exc:
            # Out of inotify watches, or the folder vanished: the safety poll still sees it.
            log.info(
                "ckptdash: cannot watch %s (%s); polled every %g s", folder, exc, self.refresh_s
            )
            return None


Strategy: TypeAlias = Inotify | Polling
