"""The runs of a folder (or one run), opened, followed, rested and closed in one place.

Every reader of several runs -- the dashboard's follower, ``ckptdash watch``, ``ckptdash
status`` -- holds them in a :class:`RunSet`, as every TensorBoard consumer holds its runs in
one ``EventMultiplexer``. The set does, once for all of them::

    find the runs (new ones join) → open each (its snapshot, else empty) → read what is new
    (RunState.apply_all over the tailer's pieces) → leave a snapshot when it read much
    → rest an idle run / wake it when its files change → close

and a reader does only what is its own with each run it hands back (the follower builds a
view's snapshot, ``watch`` runs the detectors, ``status`` prints).

Resting is a policy the reader gives (:class:`RestPolicy`; the dashboard's is in
:mod:`ckptdash.dash.feed.resting`): a run of a folder that the policy calls idle after a
read, that nobody focuses and whose tailer caught up, is dropped down to what the policy
keeps of it and the hash of its files' :func:`fingerprint`; it is opened again when that
changes (looked at every ``check_every_s``, or at once for a root the caller says changed),
or when a caller focuses it. A lone run never rests: there is nothing to save.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ckptdash.errors import CkptDashError
from ckptdash.rundir import CLAIMED_DIR, DONE_DIR, EVENTS_DIR, INBOX_DIR, RunDir, find_runs
from ckptdash.rundir.pulses import PULSES_DIR
from ckptdash.state import RunState
from ckptdash.state.reading import leave_snapshot, resume
from ckptdash.tail import RunTailer

_FOLDERS = (EVENTS_DIR, PULSES_DIR, INBOX_DIR, CLAIMED_DIR, DONE_DIR)

Fingerprint = tuple[object, ...]


def fingerprint(rd: RunDir) -> Fingerprint:
    """What a run's files look like: every entry of the folders a tailer reads (name, inode,
    size, mtime), run.json and settings.json. Equal fingerprints: nothing a reader reads
    changed. Unreadable parts count as what they are (a folder that becomes readable again is
    a change)."""
    parts: list[object] = []
    for folder in _FOLDERS:
        try:
            with os.scandir(rd.root / folder) as it:
                entries: list[tuple[object, ...]] = []
                for e in it:
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        entries.append((e.name, None))
                        continue
                    entries.append((e.name, st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError as exc:
            parts.append((folder, exc.errno))
            continue
        parts.append((folder, tuple(sorted(entries, key=lambda x: str(x[0])))))
    for path in (rd.run_file, rd.settings):
        try:
            st = os.stat(path)
            parts.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError as exc:
            parts.append(exc.errno)
    return tuple(parts)


def names_in(seen: Fingerprint, folder: str) -> list[str]:
    """The names of the entries of ``folder`` (one of the run's folders) in ``seen``."""
    for part in seen:
        if isinstance(part, tuple) and part and part[0] == folder and isinstance(part[1], tuple):
            return [entry[0] for entry in part[1]]
    return []


@dataclass(eq=False)
class OpenRun:
    """One open run: its state, the tailer it goes on with, and what the set knows of it."""

    rd: RunDir
    state: RunState
    tailer: RunTailer
    covered: int = 0
    """Bytes of log its snapshot covers (:mod:`ckptdash.state.snapshot`)."""
    sightings: int = 0
    """Command-file sightings so far (:meth:`RunState.apply_all`)."""
    records: int = 0
    """Records the last read applied (0: nothing new)."""
    reads: int = 0
    awake_since: float | None = None
    """When a resting run was opened again (None: opened when found)."""
    woken_from: object = None
    """What the policy kept of it while it rested (None: it never rested)."""
    seen: Fingerprint | None = field(default=None, repr=False)
    """Its files before the last read, when it may rest after it."""

    @property
    def root(self) -> str:
        return str(self.rd.root)


@dataclass
class Resting:
    """A resting run: what the policy kept of it, and what its files looked like."""

    rd: RunDir
    kept: object
    seen: int
    """The hash of its :func:`fingerprint` (a folder's runs times their files' entries would
    be megabytes of tuples)."""
    checked_at: float


class RestPolicy(Protocol):
    """When an open run may rest, and what stays of it (see the module docstring)."""

    @property
    def check_every_s(self) -> float:
        """How often a resting run's files are looked at."""
        ...

    def may_rest(self, run: OpenRun) -> bool:
        """Whether ``run`` is idle. Asked before a read too: True there (or for a run never
        judged yet) makes the set note its files first, so a change during the read wakes it."""
        ...

    def keep(self, run: OpenRun) -> object:
        """What stays of a run that rests (handed back as :attr:`OpenRun.woken_from`)."""
        ...


class RunSet:
    """The runs at ``path`` (a run directory or a folder of runs); see the module docstring.

    With ``strict`` a run whose run.json cannot be read is not opened: it is in
    :attr:`broken` with the reason (``ckptdash status`` prints it and goes on); without, it
    is opened with the run id ``""`` and followed until run.json can be read (the follower).

    >>> runs = RunSet("runs/")                 # doctest: +SKIP
    >>> runs.discover()                        # doctest: +SKIP
    >>> for run in runs.poll():                # doctest: +SKIP
    ...     print(run.root, run.state.latest_attempt())
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        rest: RestPolicy | None = None,
        strict: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.rest = rest
        self.strict = strict
        self.clock = clock
        self.open: dict[str, OpenRun] = {}
        self.resting: dict[str, Resting] = {}
        self.broken: dict[str, tuple[RunDir, str]] = {}
        self.is_folder = False

    def __len__(self) -> int:
        return len(self.open) + len(self.resting)

    def __contains__(self, root: object) -> bool:
        return root in self.open or root in self.resting

    def discover(self) -> list[OpenRun]:
        """Find the runs at the path and open the new ones; returns those opened. Raises
        :class:`~ckptdash.errors.RunDirError` (or ``OSError``) when the path holds no run now:
        the caller decides whether that is a wait or an error, and keeps what it has."""
        found = find_runs(self.path)
        self.is_folder = not RunDir(self.path).is_run()
        return self.join(found)

    def join(self, runs: Iterable[RunDir]) -> list[OpenRun]:
        """Open these runs (those not open or resting already); returns those opened."""
        opened = []
        for rd in runs:
            root = str(rd.root)
            if root not in self:
                run = self._open(rd)
                if run is not None:
                    opened.append(run)
        return opened

    def poll(
        self, roots: Collection[str] | None = None, focused: Collection[str] = ()
    ) -> Iterator[OpenRun]:
        """Read what is new in each open run (in root order), handing each back once read;
        first open again the resting runs that are focused or whose files changed. With
        ``roots`` only those runs are read (the rest at the next full poll). A run that may
        rest afterwards has its files noted before its read; :meth:`settle` rests it."""
        woken = self._wake(roots, focused)
        for root in sorted(self.open):
            if roots is not None and root not in roots and root not in woken:
                continue
            run = self.open[root]
            run.seen = None if root in focused else self._before_rest(run)
            run.records, sightings = run.state.apply_all(run.tailer.batches())
            run.sightings += sightings
            run.reads += 1
            if run.records and run.tailer.caught_up:  # one that read much leaves a snapshot
                run.covered = leave_snapshot(run.rd, run.state, run.tailer, run.covered)
            yield run

    def settle(self, run: OpenRun) -> bool:
        """Rest ``run`` (just read by :meth:`poll`) if the policy calls it idle; True if it
        rests. Settle each run before the next is read: one that rests is freed at once (the
        first look at a folder of 1,000 ended runs holds one run's state at a time)."""
        if run.seen is None or self.rest is None or not run.tailer.caught_up:
            return False
        if self.open.get(run.root) is not run or not self.rest.may_rest(run):
            return False
        del self.open[run.root]
        kept = self.rest.keep(run)
        self.resting[run.root] = Resting(run.rd, kept, hash(run.seen), time.monotonic())
        return True

    def close(self) -> None:
        """Let go of every run."""
        self.open.clear()
        self.resting.clear()

    def touch(self, paths: Iterable[str]) -> None:
        """Tell the tailers which event files changed (an inotify report): a cold one is read
        at the next poll."""
        for p in paths:
            folder = os.path.dirname(p)
            run = self.open.get(os.path.dirname(folder))
            if run is not None and os.path.basename(folder) == EVENTS_DIR:
                run.tailer.touch([p])

    def roots_of(self, paths: Iterable[str]) -> set[str] | None:
        """The runs these changed paths belong to; None (poll all) for a path outside any
        known run (the folder itself changed: maybe a new run)."""
        base = str(self.path)
        roots = set()
        for p in paths:
            rel = os.path.relpath(p, base)
            if rel.startswith(".."):
                return None
            if not self.is_folder:
                roots.add(base)
                continue
            first = rel.split(os.sep, 1)[0]
            root = str(self.path / first)
            if first == "." or root not in self:
                return None
            roots.add(root)
        return roots

    # --- internals ---------------------------------------------------------------------------

    def _open(self, rd: RunDir, woken_from: object = None) -> OpenRun | None:
        root = str(rd.root)
        if self.strict:
            try:
                rd.info()  # an unreadable run.json: the reader says so, and goes on
            except CkptDashError as exc:
                self.broken[root] = (rd, str(exc))
                return None
            self.broken.pop(root, None)
        state, tailer, since = resume(rd)  # from the snapshot, when one can be trusted
        run = self.open[root] = OpenRun(rd, state, tailer, covered=since, woken_from=woken_from)
        return run

    def _before_rest(self, run: OpenRun) -> Fingerprint | None:
        """A run of a folder that may rest after this read (a first read, or an idle run): its
        files' fingerprint, and every event file made due however cold."""
        if not self.is_folder or self.rest is None or not self.rest.may_rest(run):
            return None
        seen = fingerprint(run.rd)
        run.tailer.touch(names_in(seen, EVENTS_DIR))
        return seen

    def _wake(self, roots: Collection[str] | None, focused: Collection[str]) -> set[str]:
        """Open again the resting runs focused, and those whose files changed: at once for
        those in ``roots``, every ``check_every_s`` for all. Returns their roots."""
        woken: set[str] = set()
        if not self.resting or self.rest is None:
            return woken
        every = self.rest.check_every_s
        tick = time.monotonic()
        for root, rest in list(self.resting.items()):
            if root not in focused:
                due = tick - rest.checked_at >= every
                if not (due or (roots is not None and root in roots)):
                    continue
                rest.checked_at = tick
                if hash(fingerprint(rest.rd)) == rest.seen:
                    continue
            del self.resting[root]
            run = self._open(rest.rd, woken_from=rest.kept)
            if run is not None:
                run.awake_since = self.clock()
                woken.add(root)
        return woken
