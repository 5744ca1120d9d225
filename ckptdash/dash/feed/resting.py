"""Idle runs of a folder rest: the follower keeps their last snapshot, not their state.

A folder of 1,000 runs is mostly runs that ended long ago. Their :class:`RunState`,
tailer and snapshot builder are what a follower would spend its memory on, and they
change nothing any more. So once a run of a folder has had no event for
:data:`REST_AFTER_S` and no session shows it, the follower lets it rest: it keeps the
run's summary line (:func:`~ckptdash.dash.feed.snapshot.summarize`: what the run list
shows) and the hash of a :func:`~ckptdash.state.runset.fingerprint` of its files, and
drops the rest, its inotify watches included. When the fingerprint changes (a new attempt,
a command, a settings change), or a session selects the run (:meth:`RunFollower.focus
<ckptdash.dash.feed.follow.RunFollower.focus>`), the run is opened again, from its
compaction snapshot where it has one (:func:`ckptdash.state.reading.resume`), and
stays awake for at least :data:`REST_AFTER_S`.

This module is the policy (:class:`FolderRest`: when, and what stays); resting itself, the
fingerprint and the waking, is the run set's (:mod:`ckptdash.state.runset`), the same for
every reader.

A run never rests while its newest attempt says it runs on this host, so the follower's
``/proc`` check (:mod:`ckptdash.ops.liveness`) still sees a ``kill -9`` at once; nor in a
follower of one run, where there is nothing to save.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Final

from ckptdash.dash.feed.snapshot import RunSnapshot, summarize
from ckptdash.state.runset import OpenRun

REST_AFTER_S: Final = 300.0
"""A run of a folder rests after this long without an event (and at least this long after
it woke). Longer than the once-a-minute pulse a live job writes to its log."""

CHECK_EVERY_S: Final = 5.0
"""How often a resting run's files are looked at. A resting run has no inotify watch (a
user's watches are limited, and each costs kernel memory), so a resting run wakes within this
many seconds of a change."""

_HOST: Final = socket.gethostname()


class FolderRest:
    """The follower's :class:`~ckptdash.state.runset.RestPolicy`: :func:`may_rest` over the
    run's latest snapshot (``latest(root)``, None before its first), keeping its summary line.
    ``check_every`` is asked each time (tests shorten it)."""

    def __init__(
        self,
        latest: Callable[[str], RunSnapshot | None],
        clock: Callable[[], float],
        check_every: Callable[[], float] = lambda: CHECK_EVERY_S,
    ) -> None:
        self._latest = latest
        self._clock = clock
        self._check_every = check_every

    @property
    def check_every_s(self) -> float:
        return self._check_every()

    def may_rest(self, run: OpenRun) -> bool:
        last = self._latest(run.root)
        return last is None or may_rest(last, self._clock(), run.awake_since)

    def keep(self, run: OpenRun) -> RunSnapshot:
        last = self._latest(run.root)
        assert last is not None  # a run is judged idle only on a snapshot
        return summarize(last)


def may_rest(snap: RunSnapshot | None, now: float, awake_since: float | None) -> bool:
    """Whether a run of a folder with this latest snapshot may rest now (see the module)."""
    if snap is None or (awake_since is not None and now - awake_since < REST_AFTER_S):
        return False
    newest = snap.newest
    last = None if newest is None else newest.last_heartbeat_t
    if newest is None or last is None or now - last < REST_AFTER_S:
        return False
    return not (newest.outcome == "running" and newest.host == _HOST)
