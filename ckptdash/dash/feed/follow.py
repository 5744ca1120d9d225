"""Watch a run directory (or a folder of runs) and publish snapshots from one background thread.

::

    file written ──inotify (one instance)───────┐
                 or the poll timer ─────────────┴─> wake ─> worker thread:
                                                    tail new bytes → RunState.apply
                                                    → RunSnapshot → every subscriber

One thread owns every tailer and run state, so they need no lock; and the
views are updated from that plain thread, which is what keeps a notebook
widget live while another cell blocks in ``trainer.fit()`` (an event-loop
callback would wait until the cell ends).

Polling mode (:mod:`ckptdash.dash.feed.noticing`) exists for NFS and Lustre, where a
write from another host raises no inotify event on this one. It is chosen by flag, or
when the run directory's mount is a network filesystem
(:mod:`ckptdash.dash.feed.mounts`). Even with inotify the worker polls every
``refresh_s`` as a safety net, and to advance the clock that "last heartbeat 12 s ago"
and stale detection read.

In a folder, runs idle for minutes that no session shows rest
(:mod:`ckptdash.dash.feed.resting`): only their line of the run list is kept, and they are
opened again when their files change or a session selects them.

One :class:`RunFollower` per path serves every browser session:
:class:`~ckptdash.dash.feed.hub.FollowerHub` counts the sessions and stops the
follower when the last one ends.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from ckptdash import control
from ckptdash.dash.feed.mounts import WatchMode, choose_mode
from ckptdash.dash.feed.noticing import Inotify, Polling, Strategy
from ckptdash.dash.feed.resting import CHECK_EVERY_S, FolderRest
from ckptdash.dash.feed.snapshot import FolderSnapshot, RunSnapshot, SnapshotBuilder
from ckptdash.errors import CkptDashError, RunDirError
from ckptdash.events import Settings
from ckptdash.ops import liveness
from ckptdash.rundir import door
from ckptdash.state.runset import OpenRun, RunSet

log = logging.getLogger(__name__)


@dataclass
class _View:
    """What the worker keeps beside an open run of the run set: its views' snapshots and its
    settings."""

    builder: SnapshotBuilder
    settings: Settings | None = None
    settings_error: str = ""
    settings_key: object = None


Subscriber: TypeAlias = Callable[[FolderSnapshot], None]


class RunFollower:
    """Tail ``path`` (a run directory or a folder of runs) in a thread; publish every change.

    Subscribers are called in the worker thread with a :class:`FolderSnapshot`
    after every poll that found something, and at least every ``refresh_s``
    (the clock moves). A subscriber that raises is logged and kept.

    >>> with RunFollower("runs/exp1") as w:            # doctest: +SKIP
    ...     w.subscribe(lambda snap: print(snap.runs[0].progress))
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        mode: WatchMode = "auto",
        poll_interval_s: float = 1.0,
        refresh_s: float = 1.0,
        min_gap_s: float = 0.02,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not poll_interval_s > 0 or not refresh_s > 0:
            raise CkptDashError(
                f"poll_interval_s={poll_interval_s}, refresh_s={refresh_s}:"
                " both must be positive numbers of seconds"
            )
        self.path = Path(path)
        self.poll_interval_s = poll_interval_s
        chosen, reason = choose_mode(self.path, mode)
        self._strategy: Strategy = (
            Inotify(self.path, reason, refresh_s, self._note)
            if chosen == "inotify"
            else Polling(reason, poll_interval_s)
        )
        self._min_gap_s = min_gap_s  # bursts of appends are read together, not line by line
        self._clock = clock
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._loaded = threading.Event()
        self._lock = threading.Lock()  # guards subscribers and latest
        self._subscribers: list[Subscriber] = []
        rest = FolderRest(self._last_of, clock, lambda: CHECK_EVERY_S)
        self._runs = RunSet(self.path, rest=rest, clock=clock)  # opens, reads, rests the runs
        self._views: dict[str, _View] = {}  # by root, one per open run
        self._focus: dict[str, int] = {}  # roots sessions show, with how many (guarded by _lock)
        self._runs_tuple: tuple[RunSnapshot, ...] = ()
        self._version = 0
        self._problem = ""
        self._dirty: set[str] = set()  # paths inotify reported since the last poll
        self._thread: threading.Thread | None = None
        self.latest: FolderSnapshot | None = None
        self.polls = 0

    @property
    def mode(self) -> WatchMode:
        """``inotify`` or ``poll``: how changes are noticed (``poll`` after a fall-back)."""
        return self._strategy.mode

    @property
    def mode_reason(self) -> str:
        """Why this mode, as the user is shown it."""
        return self._strategy.reason

    @property
    def refresh_s(self) -> float:
        """The longest wait between two polls (the safety net under inotify)."""
        return self._strategy.refresh_s

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> RunFollower:
        """Start the worker (and the inotify observer); returns self. Idempotent."""
        if self._thread is not None:
            return self
        try:
            self._strategy.start()
        except (OSError, RuntimeError) as exc:  # no inotify instance or thread: poll, say why
            detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            reason = f"polling (inotify unavailable: {detail})"
            self._strategy = Polling(reason, self.poll_interval_s)
            log.warning("ckptdash: %s: %s", self.path, reason)
        self._thread = threading.Thread(
            target=self._run, name=f"ckptdash-watch:{self.path.name}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the worker and the observer and wait for both. Idempotent."""
        self._stop.set()
        self._wake.set()
        # The worker first: it may still be scheduling a new folder, and scheduling on an
        # observer that is stopping starts an emitter thread that nobody would stop.
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._strategy.stop(timeout)
        if self._thread is None or not self._thread.is_alive():
            self._runs.close()  # the runs' states go; the latest snapshot stays readable

    def __enter__(self) -> RunFollower:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait_loaded(self, timeout: float | None = None) -> bool:
        """Block until the first full read is published (True), or the timeout passed."""
        return self._loaded.wait(timeout)

    def wake(self) -> None:
        """Poll now rather than at the next tick (after this process wrote a control file)."""
        self._wake.set()

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Call ``fn`` with every snapshot from now on (and the latest one right away, in this
        thread); returns the function that unsubscribes."""
        with self._lock:
            self._subscribers.append(fn)
            latest = self.latest
        if latest is not None:
            self._call(fn, latest)

        def unsubscribe() -> None:
            with self._lock:
                if fn in self._subscribers:
                    self._subscribers.remove(fn)

        return unsubscribe

    def focus(self, root: str) -> Callable[[], None]:
        """Keep run ``root`` whole while a session shows it (a resting run is opened again at
        once, see :mod:`ckptdash.dash.feed.resting`); returns the function that lets go."""
        root = str(root)
        with self._lock:
            self._focus[root] = self._focus.get(root, 0) + 1
        self._wake.set()
        released = threading.Event()

        def release() -> None:
            if released.is_set():
                return
            released.set()
            with self._lock:
                left = self._focus.get(root, 0) - 1
                if left > 0:
                    self._focus[root] = left
                else:
                    self._focus.pop(root, None)

        return release

    # --- the worker --------------------------------------------------------------------------

    def _note(self, path: str) -> None:
        with self._lock:
            self._dirty.add(path)
        self._wake.set()

    def _run(self) -> None:
        last_poll = last_full = 0.0
        roots: set[str] | None = None  # None: every run
        while not self._stop.is_set():
            try:
                self._poll(roots)
                self._publish()
            except Exception:  # the follower must outlive any one bad poll
                log.exception("ckptdash: polling %s failed; trying again", self.path)
            last_poll = time.monotonic()
            if roots is None:
                last_full = last_poll
            self._wake.wait(max(0.0, self.refresh_s - (last_poll - last_full)))
            if self._stop.is_set():
                break
            # Coalesce a burst of writes into one poll, without delaying a lone write.
            gap = self._min_gap_s - (time.monotonic() - last_poll)
            if gap > 0:
                self._stop.wait(gap)
            self._wake.clear()
            with self._lock:
                dirty, self._dirty = self._dirty, set()
            self._touch(dirty)
            full = not dirty or time.monotonic() - last_full >= self.refresh_s
            roots = None if full else self._roots_of(dirty)

    def _touch(self, paths: set[str]) -> None:
        """Tell the tailers which event files inotify saw change: a cold one is read now."""
        self._runs.touch(paths)

    def _roots_of(self, paths: set[str]) -> set[str] | None:
        """The runs these changed paths belong to; None (poll all) for a path outside any run."""
        return self._runs.roots_of(paths)

    def _last_of(self, root: str) -> RunSnapshot | None:
        view = self._views.get(root)
        return None if view is None else view.builder.last

    def _poll(self, roots: set[str] | None = None) -> None:
        self.polls += 1
        if roots is None:
            self._discover()
        with self._lock:
            focused = set(self._focus)
        for run in self._runs.poll(roots, focused):
            view = self._views.get(run.root)
            if view is None:
                view = self._views[run.root] = _View(SnapshotBuilder(run.root))
                if isinstance(run.woken_from, RunSnapshot):  # its versions go on rising
                    view.builder.continue_from(run.woken_from)
            changed = run.records > 0
            changed |= self._read_settings(run, view)
            # A job killed with kill -9 writes nothing more: on its own host its pid says at
            # once that it is gone (one /proc read per poll of a running attempt).
            gone = liveness.gone_here(run.state, now=self._clock())
            last = view.builder.last
            if changed or last is None or set(gone) != set(last.gone):
                view.builder.take(
                    run.state,
                    sightings=run.sightings,
                    settings=view.settings,
                    settings_error=view.settings_error,
                    settings_key=view.settings_key,
                    gone=gone,
                    untrusted=door.untrusted(run.rd.root),
                )
            if self._runs.settle(run):  # it rests: only its line is kept, and no watch
                del self._views[run.root]
                self._strategy.unwatch_run(run.rd)
            else:
                self._strategy.watch_run(run.rd)

    def _discover(self) -> None:
        """Find the runs (new ones join as they appear); note why there are none."""
        try:
            self._runs.discover()
        except RunDirError as exc:
            # Not there yet, or no run in it yet: the training creates both, so this is the
            # normal first minute of a notebook or a served folder, not an error; the views
            # wait for the first event. A path that cannot be a run folder is a problem.
            self._problem = "" if _may_become_a_run(self.path) else str(exc)
            return
        except OSError as exc:
            self._problem = f"{self.path}: {exc.strerror or exc}"
            return
        self._problem = ""

    def _read_settings(self, run: OpenRun, view: _View) -> bool:
        """Re-read settings.json when it changed (a stat per poll); True if it did."""
        path = run.rd.settings
        try:
            st = os.stat(path)
            key: object = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            key = "missing"
        except OSError as exc:
            key = f"error: {exc}"
        if key == view.settings_key:
            return False
        view.settings_key = key
        try:
            view.settings, view.settings_error = control.read_settings(run.rd), ""
        except CkptDashError as exc:
            view.settings, view.settings_error = None, str(exc)
        return True

    def _publish(self) -> None:
        latest: dict[str, object] = {root: view.builder.last for root, view in self._views.items()}
        latest.update((root, rest.kept) for root, rest in self._runs.resting.items())
        snaps = tuple(snap for _, snap in sorted(latest.items()) if isinstance(snap, RunSnapshot))
        if len(snaps) != len(self._runs_tuple) or any(
            a is not b for a, b in zip(snaps, self._runs_tuple, strict=False)
        ):
            self._runs_tuple = snaps
        self._version += 1
        folder = FolderSnapshot(
            path=str(self.path),
            runs=self._runs_tuple,
            now=self._clock(),
            version=self._version,
            loaded=True,
            is_folder=self._runs.is_folder,
            watching=self._strategy.describe(),
            problem=self._problem,
        )
        with self._lock:
            self.latest = folder
            subscribers = list(self._subscribers)
        self._loaded.set()
        for fn in subscribers:
            self._call(fn, folder)

    @staticmethod
    def _call(fn: Subscriber, folder: FolderSnapshot) -> None:
        try:
            fn(folder)
        except Exception:
            log.exception("ckptdash: a dashboard view failed to update; it stays subscribed")


def _may_become_a_run(path: Path) -> bool:
    """Whether ``path`` is missing or a readable folder: a run (or runs) may appear there."""
    if not path.exists():
        return True
    return path.is_dir() and os.access(path, os.R_OK | os.X_OK)
