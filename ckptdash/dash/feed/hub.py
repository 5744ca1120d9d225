"""One follower per directory, shared by every session and stopped with the last one."""

from __future__ import annotations

import os
import threading
from collections.abc import MutableMapping

from ckptdash.dash.feed.follow import RunFollower
from ckptdash.dash.feed.mounts import WatchMode


class FollowerHub:
    """One follower per (path, options), shared by every session; stopped with its last session.

    Keep one hub where every session finds it (``pn.state.cache``); this module
    does not import Panel.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._followers: dict[tuple[object, ...], tuple[RunFollower, int]] = {}

    def acquire(
        self,
        path: str | os.PathLike[str],
        *,
        mode: WatchMode = "auto",
        poll_interval_s: float = 1.0,
        refresh_s: float = 1.0,
    ) -> RunFollower:
        """The running follower of ``path`` (started on first use); pair with :meth:`release`."""
        key = (os.path.realpath(path), mode, poll_interval_s, refresh_s)
        with self._lock:
            found = self._followers.get(key)
            if found is not None:
                follower, count = found
                self._followers[key] = (follower, count + 1)
                return follower
            follower = RunFollower(
                path, mode=mode, poll_interval_s=poll_interval_s, refresh_s=refresh_s
            ).start()
            self._followers[key] = (follower, 1)
            return follower

    def release(self, follower: RunFollower) -> None:
        """One session less; the last one stops the follower."""
        with self._lock:
            for key, (w, count) in list(self._followers.items()):
                if w is follower:
                    if count > 1:
                        self._followers[key] = (w, count - 1)
                        return
                    del self._followers[key]
                    break
            else:
                return
        follower.stop()

    def users(self, follower: RunFollower) -> int:
        """How many sessions hold ``follower`` (0 once it was stopped)."""
        with self._lock:
            return next((c for w, c in self._followers.values() if w is follower), 0)

    def followers(self) -> list[RunFollower]:
        with self._lock:
            return [w for w, _ in self._followers.values()]

    def close(self) -> None:
        """Stop every follower (server shutdown)."""
        with self._lock:
            followers = [w for w, _ in self._followers.values()]
            self._followers.clear()
        for w in followers:
            w.stop()


def shared_hub(cache: MutableMapping[str, object], key: str = "ckptdash.followers") -> FollowerHub:
    """The hub kept in ``cache`` (``pn.state.cache``), created on first use."""
    hub = cache.setdefault(key, FollowerHub())
    if not isinstance(hub, FollowerHub):
        raise TypeError(f"cache[{key!r}] holds {type(hub).__name__}, not a FollowerHub")
    return hub
