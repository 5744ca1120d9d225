"""How a follower notices that a run's files changed: inotify, or polling.

Polling exists for NFS and Lustre, where a write from another host raises no inotify
event on this one. Polling is the tailer's own ``stat`` of each event file, which is
cheaper than watchdog's ``PollingObserver`` (that one snapshots the whole tree,
checkpoints included, only to make us stat the event files again). Even with inotify the
worker polls every ``refresh_s`` as a safety net.

Whatever the number of runs, a follower holds one inotify instance and one thread to read it
(:mod:`ckptdash.dash.feed.inotify`); a watch that cannot be added leaves that folder to the
safety poll, and an instance or thread that cannot be started leaves the whole follower
polling: neither fails a poll.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final, TypeAlias

from ckptdash.dash.feed.inotify import Watches
from ckptdash.rundir import CLAIMED_DIR, CONTROL_DIR, DONE_DIR, EVENTS_DIR, INBOX_DIR, RunDir

log = logging.getLogger(__name__)

_RUN_FOLDERS: Final = ("", EVENTS_DIR, CONTROL_DIR, INBOX_DIR, CLAIMED_DIR, DONE_DIR)
"""The folders of a run that are watched: never checkpoints/ (a big save writes millions of
times), nor pulses/ (every rank rewrites its record every second; the safety poll reads it)."""


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
    """inotify, one instance and one thread for every run (:mod:`ckptdash.dash.feed.inotify`):
    every change under a watched folder calls ``note``; the worker still polls every
    ``refresh_s`` as a safety net, and polls alone a folder that cannot be watched."""

    mode: Final = "inotify"

    def __init__(
        self, path: Path, reason: str, refresh_s: float, note: Callable[[str], None]
    ) -> None:
        self.path = path
        self.reason = reason
        self.refresh_s = refresh_s
        self._watches = Watches(str(path), note, name=f"ckptdash-inotify:{path.name}")
        self._refused: set[str] = set()  # folders that could not be watched (said once each)

    def start(self) -> None:
        """Start the one reader thread and watch the path; ``OSError`` when inotify is
        unavailable, ``RuntimeError`` when no thread can be started (the caller polls)."""
        self._watches.start()
        self._watch(str(self.path))

    def watch_run(self, rd: RunDir) -> None:
        """Watch a run's folders as they appear (see :data:`_RUN_FOLDERS`). Never raises: a
        folder that cannot be watched is polled."""
        for sub in _RUN_FOLDERS:
            self._watch(str(rd.root / sub) if sub else str(rd.root))

    def unwatch_run(self, rd: RunDir) -> None:
        """Drop a run's watches (a resting run, :mod:`ckptdash.dash.feed.resting`, is looked at
        by its fingerprint instead: a user's inotify watches are limited)."""
        for sub in _RUN_FOLDERS:
            folder = str(rd.root / sub) if sub else str(rd.root)
            self._watches.remove(folder)
            self._refused.discard(folder)

    def stop(self, timeout: float) -> None:
        self._watches.stop(timeout)

    def describe(self) -> str:
        return f"{self.reason}, checked every {self.refresh_s:g} s"

    def _watch(self, folder: str) -> None:
        if self._watches.watching(folder) or not os.path.isdir(folder):
            return
        try:
            self._watches.add(folder)
        except OSError as exc:
            # Out of inotify watches, or the folder vanished: the safety poll still sees it.
            if folder not in self._refused:
                self._refused.add(folder)
                log.info(
                    "ckptdash: cannot watch %s (%s); polled every %g s",
                    folder,
                    exc.strerror or exc,
                    self.refresh_s,
                )


Strategy: TypeAlias = Inotify | Polling
