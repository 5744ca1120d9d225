"""Checkpoints as :class:`~ckptdash.state.RunState` sees them: what each path's events say
(:func:`checkpoint_info`), whether a path lies where the run keeps checkpoints
(:func:`outside`), the latest save outcomes, and the one order every view lists checkpoints in
(:func:`checkpoint_order`).
"""

from __future__ import annotations

import bisect
import heapq
import os
from collections.abc import Mapping
from typing import Final, TypeAlias, cast

from ckptdash import events as ev_
from ckptdash.state.records import CheckpointInfo, CheckpointStatus, SavedVersion
from ckptdash.state.streams import Key

CkptEvent: TypeAlias = (
    "ev_.CheckpointStarted | ev_.CheckpointSaved | ev_.CheckpointFailed"
    " | ev_.CheckpointRemoved | ev_.CheckpointInvalid"
)
CKPT_SLOT: Final = {
    "checkpoint_started": "started",
    "checkpoint_saved": "saved",
    "checkpoint_failed": "failed",
    "checkpoint_removed": "gone",
    "checkpoint_invalid": "gone",
}
"""Each checkpoint event kind and the slot of :attr:`Checkpoint.latest` it fills."""
_GONE: Final[dict[str, CheckpointStatus]] = {
    "checkpoint_removed": "removed",
    "checkpoint_invalid": "invalid",
}
SAVE_OUTCOMES: Final = 16
SaveOutcome: TypeAlias = tuple[float, bool, int, str]
"""One save's outcome: (t, saved?, attempt, error of a failed save)."""


def checkpoint_order(c: CheckpointInfo) -> tuple[int, float, str]:
    """The key every list of checkpoints sorts by, oldest first: (step, time of the save, path),
    a checkpoint without a step or time before every one with."""
    return (-1 if c.step is None else c.step, c.t or 0.0, c.path)


def kind(c: CheckpointInfo, by_path: Mapping[str, CheckpointInfo]) -> str:
    """What ``c`` can do, in a word or two, for every view: ``resumes`` (model, optimizer and
    loop state), ``artifact`` (weights only, an export), or ``= NAME`` (a link to or copy of
    the recorded ``NAME``; ``= NAME (artifact)`` when that one is an artifact)."""
    if c.same_as is not None:
        target = by_path.get(c.same_as)
        tail = " (artifact)" if target is not None and target.artifact else ""
        return f"= {os.path.basename(c.same_as)}{tail}"
    return "artifact" if c.artifact else "resumes"


def norm(path: str) -> str:
    """``path`` absolute and normalised (no symbolic links resolved)."""
    return os.path.normpath(os.path.abspath(path))


def outside(path: str, root: str, roots: list[str], dirs: list[str]) -> str:
    """Why ``path`` is not where the run at ``root`` keeps checkpoints: inside one of
    ``roots`` (the run directory, spelled and resolved) or of ``dirs`` (the folders it
    declared). "" when it is, or when ``roots`` is empty (a state not confined)."""
    if not roots:
        return ""
    # ckptdash records absolute paths; another writer's relative one is read as relative
    # to the run directory, and may not leave it through "..".
    where = norm(os.path.join(root, path))
    for base in (*roots, *dirs):
        if where == base or where.startswith(base.rstrip(os.sep) + os.sep):
            return ""
    return (
        f"{path} lies outside the run directory and every checkpoint folder this run"
        " declared; not this run's checkpoint (a forged or stray record)"
    )


class Checkpoint:
    """One path: its latest event of each slot by :data:`Key`, its saves, its save starts."""

    __slots__ = ("history", "latest", "saves", "starts")

    def __init__(self) -> None:
        self.latest: dict[str, tuple[Key, CkptEvent]] = {}  # "started"/"saved"/"failed"/"gone"
        self.saves = 0
        self.starts: list[float] = []
        # Every save of the path, by key: a path saved over and over keeps all of them.
        self.history: list[tuple[Key, SavedVersion]] = []

    def record(self, ev: CkptEvent, k: Key) -> str:
        """Take one of its events; returns the slot it fills."""
        slot = CKPT_SLOT[ev.KIND]
        old = self.latest.get(slot)
        if old is None or k > old[0]:
            self.latest[slot] = (k, ev)
        if slot == "saved":
            self.saves += 1
            sv = cast("ev_.CheckpointSaved", ev)
            stall = sv.duration_s if sv.blocking_s is None else sv.blocking_s
            version = SavedVersion(
                sv.t, sv.step, sv.attempt, sv.rank, sv.trigger, sv.size_bytes, sv.duration_s, stall
            )
            bisect.insort(self.history, (k, version), key=lambda item: item[0])
        elif slot == "started":
            bisect.insort(self.starts, ev.t)
        return slot


def push_outcome(outcomes: list[tuple[Key, SaveOutcome]], ev: CkptEvent, k: Key) -> None:
    """Keep a save's (or failed save's) outcome in ``outcomes``, a heap of the latest
    :data:`SAVE_OUTCOMES` by event key."""
    error = ev.error if isinstance(ev, ev_.CheckpointFailed) else ""
    item = (k, (ev.t, isinstance(ev, ev_.CheckpointSaved), ev.attempt, error))
    if len(outcomes) < SAVE_OUTCOMES:
        heapq.heappush(outcomes, item)
    else:
        heapq.heappushpop(outcomes, item)  # keeps the latest


def checkpoint_info(path: str, c: Checkpoint) -> CheckpointInfo:
    """What the log says about ``path`` (before confinement, which the state applies)."""
    latest = c.latest
    saved, gone, failed = latest.get("saved"), latest.get("gone"), latest.get("failed")
    started = latest.get("started")
    last = max(latest.values(), key=lambda item: item[0])[1]
    valid = saved is not None and (gone is None or saved[0] > gone[0])
    status: CheckpointStatus
    if isinstance(last, ev_.CheckpointRemoved | ev_.CheckpointInvalid):
        status = _GONE[last.KIND]
        reason = last.reason
    elif valid:
        status, reason = "saved", ""  # a save (or failed save) over it leaves the old file intact
    else:
        status = "failed" if isinstance(last, ev_.CheckpointFailed) else "saving"
        reason = ""
    base = (saved or started or failed or gone or (None, last))[1]
    info = CheckpointInfo(
        path,
        status,
        step=base.step,
        attempt=base.attempt,
        rank=base.rank,
        reason=reason,
        replaced=max(0, c.saves - 1),
    )
    if saved is not None and len(c.history) > 1:
        info.earlier = tuple(v for k, v in c.history if k != saved[0])
    if not isinstance(base, ev_.CheckpointRemoved | ev_.CheckpointInvalid):
        info.trigger = base.trigger
    if saved is not None:
        sv = cast("ev_.CheckpointSaved", saved[1])
        info.epoch, info.t, info.size_bytes = sv.epoch, sv.t, sv.size_bytes
        info.duration_s, info.checksum = sv.duration_s, sv.checksum
        info.blocking_s = sv.duration_s if sv.blocking_s is None else sv.blocking_s
        info.monitored = sv.monitored
        info.written_at, info.unvalidated = sv.written_at, sv.unvalidated or ""
        info.artifact, info.same_as = sv.artifact or "", sv.same_as
        i = bisect.bisect_right(c.starts, sv.t)  # its checkpoint_started, if it wrote one
        info.started_at = c.starts[i - 1] if i else sv.t - sv.duration_s
    elif c.starts:
        info.started_at = c.starts[-1]
    if failed is not None and (saved is None or failed[0] > saved[0]):
        info.error = cast("ev_.CheckpointFailed", failed[1]).error
    return info
