"""One watcher per directory, shared by every session and stopped with the last one."""

from __future__ import annotations

import os
import threading
from collections.abc import MutableMapping

from ckptdash.dash.feed.follow import RunWatcher
from ckptdash.dash.feed.mounts import WatchMode


class WatcherHub:
    """One watcher per (path, options), shared by every session; stopped with its last session.

    Keep one hub where every session finds it (``pn.state.cache``); this module
    does not import Panel.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watchers: dict[tuple[object, ...], tuple[RunWatcher, int]] = {}

    def acquire(
        self,
        path: str | os.PathLike[str],
        *,
        mode: WatchMode = "auto",
        poll_interval_s: float = 1.0,
        refresh_s: float = 1.0,
    ) -> RunWatcher:
        """The running watcher of ``path`` (started on first use); pair with :meth:`release`."""
        key = (os.path.realpath(path), mode, poll_interval_s, refresh_s)
        with self._lock:
            found = self._watchers.get(key)
            if found is not None:
                watcher, count = found
                self._watchers[key] = (watcher, count + 1)
                return watcher
            watcher = RunWatcher(
                path, mode=mode, poll_interval_s=poll_interval_s, refresh_s=refresh_s
            ).start()
            self._watchers[key] = (watcher, 1)
            return watcher

    def release(self, watcher: RunWatcher) -> None:
        """One session less; the last one stops the watcher."""
        with self._lock:
            for key, (w, count) in list(self._watchers.items()):
                if w is watcher:
                    if count > 1:
                        self._watchers[key] = (w, count - 1)
                        return
                    del self._watchers[key]
                    break
            else:
                return
        watcher.stop()

    def users(self, watcher: RunWatcher) -> int:
        """How many sessions hold ``watcher`` (0 once it was stopped)."""
        with self._lock:
            return next((c for w, c in self._watchers.values() if w is watcher), 0)

    def watchers(self) -> list[RunWatcher]:
        with self._lock:
            return [w for w, _ in self._watchers.values()]

    def close(self) -> None:
        """Stop every watcher (server shutdown)."""
        with self._lock:
            watchers = [w for w, _ in self._watchers.values()]
            self._watchers.clear()
        for w in watchers:
            w.stop()


def shared_hub(cache: MutableMapping[str, object], key: str = "ckptdash.watchers") -> WatcherHub:
    """The hub kept in ``cache`` (``pn.state.cache``), created on first use."""
    hub = cache.setdefault(key, WatcherHub())
    if not isinstance(hub, WatcherHub):
        raise TypeError(f"cache[{key!r}] holds {type(hub).__name__}, not a WatcherHub")
    return hub
