"""Watch a run directory (or a folder of runs) and publish snapshots from one background thread.

::

    file written ──inotify (watchdog Observer)──┐
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
from ckptdash.dash.feed.resting import (
    CHECK_EVERY_S,
    Fingerprint,
    Resting,
    fingerprint,
    may_rest,
    names_in,
)
from ckptdash.dash.feed.snapshot import FolderSnapshot, RunSnapshot, SnapshotBuilder, summarize
from ckptdash.errors import CkptDashError, RunDirError
from ckptdash.events import Settings
from ckptdash.ops import liveness
from ckptdash.rundir import EVENTS_DIR, RunDir, door, find_runs
from ckptdash.state import RunState
from ckptdash.state.reading import leave_snapshot, resume
from ckptdash.tail import RunTailer

log = logging.getLogger(__name__)


@dataclass
class _Run:
    """One run as the worker keeps it."""

    rd: RunDir
    tailer: RunTailer
    state: RunState
    builder: SnapshotBuilder
    sightings: int = 0
    settings: Settings | None = None
    settings_error: str = ""
    settings_key: object = None
    covered: int = 0  # bytes of log its snapshot covers (ckptdash.state.snapshot)
    awake_since: float | None = None  # when a resting run was opened again


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
        self._runs: dict[str, _Run] = {}
        self._resting: dict[str, Resting] = {}
        self._focus: dict[str, int] = {}  # roots sessions show, with how many (guarded by _lock)
        self._runs_tuple: tuple[RunSnapshot, ...] = ()
        self._version = 0
        self._problem = ""
        self._is_folder = False
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
        except OSError as exc:  # inotify instances exhausted: fall back, say why (as watchdog does)
            reason = f"polling (inotify unavailable: {exc.strerror or exc})"
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
        for p in paths:
            folder = os.path.dirname(p)
            run = self._runs.get(os.path.dirname(folder))
            if run is not None and os.path.basename(folder) == EVENTS_DIR:
                run.tailer.touch([p])

    def _roots_of(self, paths: set[str]) -> set[str] | None:
        """The runs these changed paths belong to; None (poll all) for a path outside any run."""
        base = str(self.path)
        roots = set()
        for p in paths:
            rel = os.path.relpath(p, base)
            if rel.startswith(".."):
                return None
            if not self._is_folder:
                roots.add(str(self.path))
                continue
            first = rel.split(os.sep, 1)[0]
            root = str(self.path / first)
            if first == "." or (root not in self._runs and root not in self._resting):
                return None  # the folder itself changed: maybe a new run
            roots.add(root)
        return roots

    def _poll(self, roots: set[str] | None = None) -> None:
        self.polls += 1
        if roots is None:
            self._discover()
        with self._lock:
            focused = set(self._focus)
        woken = self._wake_changed(roots, focused)
        for root in list(self._runs):  # not a list of the runs: one that rests is freed at once
            if roots is not None and root not in roots and root not in woken:
                continue
            run = self._runs[root]
            # Before the read: what the run rests with, if it may (changes after it wake it).
            seen = None if root in focused else self._before_rest(run)
            records, sightings = run.state.apply_all(run.tailer.batches())
            run.sightings += sightings
            changed = records > 0
            if changed and run.tailer.caught_up:  # one that read much leaves a snapshot
                run.covered = leave_snapshot(run.rd, run.state, run.tailer, run.covered)
            changed |= self._read_settings(run)
            # A job killed with kill -9 writes nothing more: on its own host its pid says at
            # once that it is gone (one /proc read per poll of a running attempt).
            gone = liveness.gone_here(run.state, now=self._clock())
            last = run.builder.last
            if changed or last is None or set(gone) != set(last.gone):
                last = run.builder.take(
                    run.state,
                    sightings=run.sightings,
                    settings=run.settings,
                    settings_error=run.settings_error,
                    settings_key=run.settings_key,
                    gone=gone,
                    untrusted=door.untrusted(run.rd.root),
                )
            idle = last is not None and may_rest(last, self._clock(), run.awake_since)
            if seen is not None and last is not None and idle and run.tailer.caught_up:
                del self._runs[root]
                self._strategy.unwatch_run(run.rd)
                self._resting[root] = Resting(run.rd, summarize(last), hash(seen), time.monotonic())
            else:
                self._strategy.watch_run(run.rd)

    def _before_rest(self, run: _Run) -> Fingerprint | None:
        """A run of a folder that may rest after this poll (a first read, or an idle run): its
        files' fingerprint, and every event file made due however cold (see :mod:`.resting`)."""
        last = run.builder.last
        if not self._is_folder:
            return None
        if last is not None and not may_rest(last, self._clock(), run.awake_since):
            return None
        seen = fingerprint(run.rd)
        run.tailer.touch(names_in(seen, EVENTS_DIR))
        return seen

    def _wake_changed(self, roots: set[str] | None, focused: set[str]) -> set[str]:
        """Open again the resting runs a session shows, and those whose files changed: at once
        for those in ``roots`` (an inotify report), every :data:`~.resting.CHECK_EVERY_S` for
        all. Returns their roots."""
        woken = set()
        tick = time.monotonic()
        for root, rest in list(self._resting.items()):
            if root not in focused:
                due = tick - rest.checked_at >= CHECK_EVERY_S
                if not (due or (roots is not None and root in roots)):
                    continue
                rest.checked_at = tick
                if hash(fingerprint(rest.rd)) == rest.seen:
                    continue
            del self._resting[root]
            run = self._open(rest.rd)
            run.awake_since = self._clock()
            run.builder.continue_from(rest.snapshot)
            self._runs[root] = run
            woken.add(root)
        return woken

    def _open(self, rd: RunDir) -> _Run:
        state, tailer, since = resume(rd)  # from the snapshot, when one can be trusted
        return _Run(rd, tailer, state, SnapshotBuilder(str(rd.root)), covered=since)

    def _discover(self) -> None:
        """Find the runs (new ones join as they appear); note why there are none."""
        try:
            runs = find_runs(self.path)
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
        self._is_folder = not RunDir(self.path).is_run()
        for rd in runs:
            root = str(rd.root)
            if root not in self._runs and root not in self._resting:
                self._runs[root] = self._open(rd)

    def _read_settings(self, run: _Run) -> bool:
        """Re-read settings.json when it changed (a stat per poll); True if it did."""
        path = run.rd.settings
        try:
            st = os.stat(path)
            key: object = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            key = "missing"
        except OSError as exc:
            key = f"error: {exc}"
        if key == run.settings_key:
            return False
        run.settings_key = key
        try:
            run.settings, run.settings_error = control.read_settings(run.rd), ""
        except CkptDashError as exc:
            run.settings, run.settings_error = None, str(exc)
        return True

    def _publish(self) -> None:
        latest = {root: run.builder.last for root, run in self._runs.items()}
        latest.update((root, rest.snapshot) for root, rest in self._resting.items())
        snaps = tuple(snap for _, snap in sorted(latest.items()) if snap is not None)
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
            is_folder=self._is_folder,
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
