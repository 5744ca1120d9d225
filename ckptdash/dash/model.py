"""The per-session model and what the header derives from a snapshot (no Panel here).

:class:`DashModel` is a ``param.Parameterized`` that the views of one session
bind to; the follower's thread publishes :class:`~ckptdash.dash.feed.snapshot.FolderSnapshot`
objects into it. :func:`run_status` and :func:`rates` turn a snapshot and the
clock into the header's state word, speed, ETA and time left.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

import param

from ckptdash import humanize
from ckptdash.analysis.run_words import RunWord, run_word
from ckptdash.dash.feed.snapshot import FolderSnapshot, RunSnapshot
from ckptdash.state.records import SHOWN_STALE_AFTER_S

RunStatus: TypeAlias = RunWord

DEFAULT_STALE_AFTER_S: Final = SHOWN_STALE_AFTER_S
"""A running attempt with no event for this long is shown as stale (the job stopped writing)."""

RATE_WINDOW_S: Final = 300.0
"""Steps/s is measured over the newest attempt's progress points of the last five minutes."""

# --- what the header says ------------------------------------------------------------------------


def run_status(
    snap: RunSnapshot | None, now: float, stale_after_s: float = DEFAULT_STALE_AFTER_S
) -> tuple[RunStatus, str]:
    """The run's state in one word (see :data:`RunStatus`) and a line saying why."""
    newest = None if snap is None else snap.newest
    if snap is None or newest is None:
        return "waiting", "no attempt has started yet"
    n = newest.attempt
    word = run_word(newest, snap.requeues, snap.signals, now, stale_after_s)
    if word in ("running", "stale") and n in snap.gone:
        return "lost", snap.gone[n]  # its host says its process is gone (kill -9, OOM)
    if word == "stale":
        seen = newest.last_heartbeat_t or now
        return "stale", (
            f"attempt {n} wrote nothing for {now - seen:.0f} s (more than"
            f" {stale_after_s:.0f} s) and never said it ended: killed, hung, or its host"
            " lost the filesystem"
        )
    if word == "running":
        signalled = [s for s in snap.signals if s.attempt == n]
        if signalled:
            return "running", f"attempt {n} got {signalled[-1].signal}: saving before it stops"
        return "running", f"attempt {n} is training"
    if word == "finished":
        why = newest.end_reason.partition("completed:")[2].strip()  # e.g. early stopping
        return "finished", f"attempt {n} completed the training" + (f": {why}" if why else "")
    if word == "failed":
        return "failed", f"attempt {n} failed: {newest.end_reason}"
    if word == "lost":
        return "lost", f"attempt {n} is gone without saying it ended (killed without warning)"
    if word == "requeue pending":
        return word, f"attempt {n} asked the scheduler to run the job again"
    why = next((r.reason for r in snap.requeues if r.attempt == n and not r.issued), "")
    not_requeued = f"; not requeued: {why}" if why else ""
    if word == "terminated":
        return word, (
            f"attempt {n} was terminated (SIGTERM: Ctrl-C, scancel or a time limit)" + not_requeued
        )
    if word == "preempted":
        return word, f"attempt {n} was preempted" + not_requeued
    return "stopped", f"attempt {n} stopped: {newest.end_reason or 'no reason given'}"


@dataclass(frozen=True)
class Rates:
    """Speed and the clocks that follow from it, for the header."""

    step: int | None
    epoch: int | None
    max_steps: int | None
    fraction: float | None
    steps_per_s: float | None
    eta_s: float | None
    time_left_s: float | None


def rates(snap: RunSnapshot | None, now: float) -> Rates:
    """Step, progress fraction, steps/s (last five minutes), ETA and time left to the time limit.

    ETA and time left are given only while the newest attempt is running.
    """
    if snap is None or snap.newest is None:
        return Rates(None, None, None, None, None, None, None)
    newest = snap.newest
    p = snap.progress
    step = newest.step if p is None or p.step is None else max(p.step, newest.step or 0)
    epoch = newest.epoch if p is None else p.epoch
    max_steps = newest.max_steps
    step = humanize.steps_done(step, max_steps, newest.outcome == "finished")
    fraction = None
    if max_steps and step is not None:
        fraction = min(1.0, step / max_steps)
    speed = _steps_per_s(snap.series.get(newest.attempt, ()))
    running = newest.outcome == "running"
    eta = None
    if running and speed and max_steps and step is not None:
        eta = max(0.0, (max_steps - step) / speed)
    left = None
    if running and p is not None and p.time_left_s is not None and p.attempt == newest.attempt:
        left = p.time_left_s - max(0.0, now - p.t)
    return Rates(step, epoch, max_steps, fraction, speed, eta, left)


def _steps_per_s(points: Sequence[tuple[float, int]]) -> float | None:
    if len(points) < 2:
        return None
    t_end, s_end = points[-1]
    start = next(((t, s) for t, s in points if t >= t_end - RATE_WINDOW_S), points[0])
    if start[0] >= t_end:
        start = points[-2]
    dt = t_end - start[0]
    return (s_end - start[1]) / dt if dt > 0 else None


# --- the per-session model -----------------------------------------------------------------------


class DashModel(param.Parameterized):  # type: ignore[misc]
    """One session's view of the watched folder: what the follower published, what is selected.

    The follower thread calls :meth:`publish`; views watch the parameters.
    Nothing here writes files: controls write through :mod:`ckptdash.control`
    and their effect comes back as a new snapshot.
    """

    path = param.String(default="", constant=True, doc="The run directory or folder of runs.")
    runs = param.Parameter(default=(), doc="Every run: a tuple of RunSnapshot, sorted by name.")
    selected = param.String(default="", doc="Root of the run the detail views show.")
    run = param.Parameter(default=None, doc="RunSnapshot of the selected run, or None.")
    now = param.Number(default=0.0, doc="The follower's clock at its last refresh.")
    loaded = param.Boolean(default=False, doc="True once the first full read is done.")
    is_folder = param.Boolean(default=False, doc="True when path is a folder of runs.")
    watching = param.String(default="", doc="How the files are watched (inotify / polling).")
    problem = param.String(default="", doc="Why nothing can be shown (missing folder …).")
    stale_after_s = param.Number(default=DEFAULT_STALE_AFTER_S, bounds=(0, None))

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        self._lock = threading.RLock()
        self._version = -1

    def publish(self, folder: FolderSnapshot) -> None:
        """Take a new snapshot (called from the follower thread; older ones are ignored)."""
        with self._lock:
            if folder.version <= self._version:
                return
            self._version = folder.version
            updates: dict[str, object] = {
                "now": folder.now,
                "loaded": folder.loaded,
                "is_folder": folder.is_folder,
                "watching": folder.watching,
                "problem": folder.problem,
            }
            if folder.runs is not self.runs:
                updates["runs"] = folder.runs
            selected = self.selected
            if not any(r.root == selected for r in folder.runs):
                selected = _default_selection(folder.runs)
                updates["selected"] = selected
            run = next((r for r in folder.runs if r.root == selected), None)
            if run is not self.run:
                updates["run"] = run
            updates = {k: v for k, v in updates.items() if not _same(getattr(self, k), v)}
            if updates:
                self.param.update(**updates)

    def select(self, root: str) -> None:
        """Show run ``root``; raises ValueError for anything that is not one of the runs."""
        with self._lock:
            run = next((r for r in self.runs if r.root == root), None)
            if run is None:
                raise ValueError(f"{root!r} is not a run of {self.path}")
            if root != self.selected or run is not self.run:
                self.param.update(selected=root, run=run)

    def status(self) -> tuple[RunStatus, str]:
        """The selected run's status now."""
        return run_status(self.run, self.now, self.stale_after_s)


def _same(a: object, b: object) -> bool:
    if isinstance(a, (str, bool, int, float)) and isinstance(b, (str, bool, int, float)):
        return a == b
    return a is b


def _default_selection(runs: Sequence[RunSnapshot]) -> str:
    """The run with the most recent sign of life (a folder's active run), else the first."""
    if not runs:
        return ""
    return max(runs, key=lambda r: (r.last_seen or 0.0, r.name)).root
