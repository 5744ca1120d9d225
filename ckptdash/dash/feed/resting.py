"""Idle runs of a folder rest: the follower keeps their last snapshot, not their state.

A folder of 1,000 runs is mostly runs that ended long ago. Their :class:`RunState`,
tailer and snapshot builder are what a follower would spend its memory on, and they
change nothing any more. So once a run of a folder has had no event for
:data:`REST_AFTER_S` and no session shows it, the follower lets it rest: it keeps the
run's summary line (:func:`~ckptdash.dash.feed.snapshot.summarize`: what the run list
shows) and the hash of a :func:`fingerprint` of its files, and drops the rest, its
inotify watches included. When the fingerprint changes (a new attempt, a command, a
settings change), or a session selects the run (:meth:`RunFollower.focus
<ckptdash.dash.feed.follow.RunFollower.focus>`), the run is opened again, from its
compaction snapshot where it has one (:func:`ckptdash.state.reading.resume`), and
stays awake for at least :data:`REST_AFTER_S`.

A run never rests while its newest attempt says it runs on this host, so the follower's
``/proc`` check (:mod:`ckptdash.ops.liveness`) still sees a ``kill -9`` at once; nor in a
follower of one run, where there is nothing to save.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Final

from ckptdash.dash.feed.snapshot import RunSnapshot
from ckptdash.rundir import CLAIMED_DIR, DONE_DIR, EVENTS_DIR, INBOX_DIR, RunDir
from ckptdash.rundir.pulses import PULSES_DIR

REST_AFTER_S: Final = 300.0
"""A run of a folder rests after this long without an event (and at least this long after
it woke). Longer than the once-a-minute pulse a live job writes to its log."""

CHECK_EVERY_S: Final = 5.0
"""How often a resting run's files are looked at. A resting run has no inotify watch (a
user's watches are limited, and each costs kernel memory), so a resting run wakes within this
many seconds of a change."""

_HOST: Final = socket.gethostname()
_FOLDERS: Final = (EVENTS_DIR, PULSES_DIR, INBOX_DIR, CLAIMED_DIR, DONE_DIR)

Fingerprint = tuple[object, ...]


def fingerprint(rd: RunDir) -> Fingerprint:
    """What a run's files look like: every entry of the folders a tailer reads (name, inode,
    size, mtime), run.json and settings.json. Equal fingerprints: nothing the follower reads
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


@dataclass
class Resting:
    """A resting run: what the views show of it, and what its files looked like."""

    rd: RunDir
    snapshot: RunSnapshot
    seen: int
    """The hash of its :func:`fingerprint` (a folder's runs times their files' entries would
    be megabytes of tuples)."""
    checked_at: float


def may_rest(snap: RunSnapshot | None, now: float, awake_since: float | None) -> bool:
    """Whether a run of a folder with this latest snapshot may rest now (see the module)."""
    if snap is None or (awake_since is not None and now - awake_since < REST_AFTER_S):
        return False
    newest = snap.newest
    last = None if newest is None else newest.last_heartbeat_t
    if newest is None or last is None or now - last < REST_AFTER_S:
        return False
    return not (newest.outcome == "running" and newest.host == _HOST)
