"""Immutable snapshots of runs: what every session's views read.

The follower (:mod:`ckptdash.dash.feed.follow`) owns every
:class:`~ckptdash.state.RunState` and, after each poll, turns the runs that
changed into :class:`RunSnapshot` objects with a :class:`SnapshotBuilder`;
every browser session (and the notebook widget) gets the same snapshots.

A snapshot never changes once built, and the builder reuses the parts of the
previous snapshot that did not change (the checkpoint tuple, the commands …),
so a view can skip work with an identity test: ``new.checkpoints is
old.checkpoints`` means the table is already right.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ckptdash.analysis.health import Facts
from ckptdash.events import CHECKPOINT_KINDS, COMMAND_KINDS, Settings
from ckptdash.resume import ResumeChoice, choose_resume
from ckptdash.state import RunState
from ckptdash.state.checkpoints import checkpoint_order
from ckptdash.state.metric_points import MetricPoints
from ckptdash.state.records import (
    AnomalyInfo,
    AttemptInfo,
    AttemptTimes,
    CheckpointInfo,
    CommandInfo,
    ExceptionInfo,
    LoggerInfo,
    MetricPoint,
    Progress,
    RequeueInfo,
    SignalInfo,
)


@dataclass(frozen=True)
class RunSignature:
    """What a :class:`RunSnapshot` was built from, part by part. Equal signatures: the same
    snapshot; an equal part: the next snapshot reuses what was built from it."""

    events_total: int
    checkpoints: tuple[int, ...]
    """How many events of each checkpoint kind (:data:`~ckptdash.events.CHECKPOINT_KINDS`)."""
    commands: tuple[tuple[int, ...], int]
    """How many events of each command kind, and the command-file sightings."""
    lists: tuple[int, int, int]
    """How many signals, requeues and exceptions."""
    progress: tuple[int, int, int]
    """How many heartbeats and pulses (rank-0 pulses feed the progress series too), and
    attempts."""
    bad_lines: tuple[tuple[str, int], ...]
    settings_key: object
    """Changes whenever the settings file did."""
    run_id: str
    gone: tuple[int, ...] = ()
    """The running attempts whose process this host found gone (:mod:`ckptdash.ops.liveness`)."""

    @classmethod
    def of(
        cls,
        state: RunState,
        *,
        sightings: int,
        settings_key: object,
        gone: Mapping[int, str] | None = None,
    ) -> RunSignature:
        counts = state.event_counts
        return cls(
            events_total=state.events_total,
            checkpoints=tuple(counts.get(k, 0) for k in CHECKPOINT_KINDS),
            commands=(tuple(counts.get(k, 0) for k in COMMAND_KINDS), sightings),
            lists=(len(state.signals), len(state.requeues), len(state.exceptions)),
            progress=(
                counts.get("heartbeat", 0),
                counts.get("pulse", 0) + state.record_pulses,
                len(state.attempts),
            ),
            bad_lines=tuple(sorted(state.bad_lines.counts.items())),
            settings_key=settings_key,
            run_id=state.run_id,
            gone=tuple(sorted(gone or {})),
        )


@dataclass(frozen=True)
class RunSnapshot:
    """One run as it was after a poll; never changes (parts are shared between snapshots)."""

    root: str
    name: str
    run_id: str
    version: int
    attempts: tuple[AttemptInfo, ...]
    checkpoints: tuple[CheckpointInfo, ...]
    """Newest first (:func:`~ckptdash.state.checkpoints.checkpoint_order` reversed)."""
    signals: tuple[SignalInfo, ...]
    requeues: tuple[RequeueInfo, ...]
    exceptions: tuple[ExceptionInfo, ...]
    commands: tuple[CommandInfo, ...]
    """Newest first, by the time they were issued."""
    progress: Progress | None
    series: Mapping[int, Sequence[tuple[float, int]]]
    settings: Settings | None
    settings_error: str
    resume: ResumeChoice | None
    events_total: int
    bad_lines: Mapping[str, int]
    replaced: int
    signature: RunSignature = field(repr=False, compare=False)
    times: Mapping[int, AttemptTimes] = field(default_factory=dict)
    """Per attempt, what badput needs (:mod:`ckptdash.analysis.goodput`)."""
    metrics: Mapping[int, Sequence[MetricPoint]] = field(default_factory=dict, repr=False)
    """Per attempt, thinned rank-0 heartbeats with their metrics, by step (the metrics plot)."""
    anomalies: tuple[AnomalyInfo, ...] = ()
    loggers: tuple[LoggerInfo, ...] = ()
    """The experiment-logger runs the curves go to (TensorBoard, W&B, ...), by logger name."""
    gone: Mapping[int, str] = field(default_factory=dict)
    """Running attempts whose process is gone from this host, with a line saying so
    (:func:`ckptdash.ops.liveness.gone_here`): the header and health say ``lost`` at once
    instead of ``running`` until the pulses are missed."""
    health: Facts | None = field(default=None, repr=False, compare=False)
    """What the health detectors read (:func:`ckptdash.analysis.health.detect` runs on it as the
    clock
    moves); also the newest attempt's ranks, for the ranks view."""
    untrusted: str = ""
    """Why the run's folders are not its owner's alone ("" when they are:
    :func:`ckptdash.rundir.door.untrusted`): the header shows the run as untrusted."""
    summary: bool = False
    """Only what the run list shows (a resting run nobody looks at,
    :mod:`ckptdash.dash.feed.resting`): no checkpoints, series, metrics, commands or health.
    The follower opens the run again as soon as a session selects it."""

    @property
    def newest(self) -> AttemptInfo | None:
        """The newest attempt (the one that decides the run's status)."""
        return self.attempts[-1] if self.attempts else None

    @property
    def last_seen(self) -> float | None:
        """The time of the newest attempt's last event: its last sign of life."""
        newest = self.newest
        return None if newest is None else newest.last_heartbeat_t

    def valid_paths(self) -> frozenset[str]:
        """Paths of checkpoints that are resume candidates (the only ones a pin may name):
        saved, and resuming training (no artifact)."""
        return frozenset(c.path for c in self.checkpoints if c.status == "saved" and c.resumable)


def summarize(snap: RunSnapshot) -> RunSnapshot:
    """``snap`` with only what the run list and the default selection read: the attempts and
    their times, signals, requeues, counts, settings; the rest, which grows with the run, left
    out (:attr:`RunSnapshot.summary`)."""
    if snap.summary:
        return snap
    return dataclasses.replace(
        snap,
        checkpoints=(),
        exceptions=(),
        commands=(),
        series={},
        metrics={},
        anomalies=(),
        health=None,
        summary=True,
    )


@dataclass(frozen=True)
class FolderSnapshot:
    """Everything one follower knows at one moment: every run, the clock, and how it watches."""

    path: str
    runs: tuple[RunSnapshot, ...]
    now: float
    version: int
    loaded: bool
    is_folder: bool
    watching: str
    problem: str = ""


class SnapshotBuilder:
    """Turns one run's :class:`RunState` into :class:`RunSnapshot` objects, reusing what did not
    change. Call :meth:`take` from the thread that applies events to the state (the follower's).
    """

    def __init__(self, root: str) -> None:
        self.root = root
        self.name = Path(root).name or root
        self.last: RunSnapshot | None = None
        self._version = 0
        self._resume_sig: object = None

    def continue_from(self, snap: RunSnapshot) -> None:
        """Go on from ``snap``, the run's last snapshot before it rested and was opened again
        (:mod:`ckptdash.dash.feed.resting`): the versions of its snapshots keep rising."""
        self._version = max(self._version, snap.version)

    def take(
        self,
        state: RunState,
        *,
        sightings: int,
        settings: Settings | None,
        settings_error: str,
        settings_key: object,
        gone: Mapping[int, str] | None = None,
        untrusted: str = "",
    ) -> RunSnapshot:
        """The run now; the previous snapshot itself when nothing changed.

        ``sightings`` counts command-file sightings the tailer reported (they
        change a command's status without an event); ``settings_key`` changes
        whenever the settings file did; ``gone``: running attempts whose process is gone.
        """
        signature = RunSignature.of(
            state, sightings=sightings, settings_key=settings_key, gone=gone
        )
        old = self.last
        if old is not None and old.signature == signature:
            return old
        self._version += 1
        checkpoints = (
            old.checkpoints
            if old is not None and old.signature.checkpoints == signature.checkpoints
            else _checkpoints_newest_first(state)
        )
        commands = (
            old.commands
            if old is not None and old.signature.commands == signature.commands
            else _commands_newest_first(state)
        )
        if old is not None and old.signature.progress == signature.progress:
            series, metrics = old.series, old.metrics
        else:
            series = {n: tuple(points) for n, points in state.series.items()}
            # Decoded only when a view reads them: a folder's runs but the shown one never are.
            metrics = MetricPoints(state.metric_heartbeats(), state.metric_decoder)
        resume = self._resume(state, signature, old)
        # AttemptInfo objects are updated in place by the state: copy them.
        attempts = tuple(dataclasses.replace(a) for a in state.attempts.values())
        facts = _facts(state, attempts, series, checkpoints)
        snap = RunSnapshot(
            root=self.root,
            name=self.name,
            run_id=state.run_id,
            version=self._version,
            attempts=attempts,
            checkpoints=checkpoints,
            signals=tuple(state.signals),
            requeues=tuple(state.requeues),
            exceptions=tuple(state.exceptions),
            commands=commands,
            progress=state.progress,
            series=series,
            settings=settings,
            settings_error=settings_error,
            resume=resume,
            events_total=state.events_total,
            bad_lines=dict(state.bad_lines.counts),
            replaced=state.replaced,
            signature=signature,
            times=state.attempt_times(),
            metrics=metrics,
            anomalies=tuple(state.anomalies),
            loggers=tuple(state.loggers[n] for n in sorted(state.loggers)),
            gone=dict(gone or {}),
            health=facts,
            untrusted=untrusted,
        )
        self.last = snap
        return snap

    def _resume(
        self, state: RunState, signature: RunSignature, old: RunSnapshot | None
    ) -> ResumeChoice | None:
        """The resume rule's answer, applied again only when the checkpoints or the settings
        changed (it stats every candidate)."""
        resume_sig = (signature.checkpoints, signature.settings_key)
        resume = old.resume if old is not None and resume_sig == self._resume_sig else None
        if resume is None:
            resume = _resume_choice(self.root, state)
            self._resume_sig = resume_sig
        return resume


def _checkpoints_newest_first(state: RunState) -> tuple[CheckpointInfo, ...]:
    return tuple(sorted(state.checkpoints.values(), key=checkpoint_order, reverse=True))


def _commands_newest_first(state: RunState) -> tuple[CommandInfo, ...]:
    return tuple(
        sorted(
            state.commands.values(),
            key=lambda c: (c.issued_at or c.received_at or c.resolved_at or 0.0, c.id),
            reverse=True,
        )
    )


def _facts(
    state: RunState,
    attempts: tuple[AttemptInfo, ...],
    series: Mapping[int, Sequence[tuple[float, int]]],
    checkpoints: tuple[CheckpointInfo, ...],
) -> Facts:
    """What the health detectors read: the newest attempt's ranks and progress."""
    newest = attempts[-1].attempt if attempts else None
    return Facts(
        attempts={a.attempt: a for a in attempts},
        ranks=tuple(state.rank_info(newest)) if newest is not None else (),
        series={n: p for n, p in series.items() if n == newest},
        checkpoints=checkpoints,
        signals=tuple(state.signals),
        save_outcomes=tuple(state.save_outcomes()),
    )


def _resume_choice(root: str, state: RunState) -> ResumeChoice | None:
    # "size" validation: a stat per candidate. The dashboard never reads a checkpoint's
    # bytes (a checksum of a 50 GB file on every new save would stall the page).
    try:
        return choose_resume(root, validate="size", state=state)
    except Exception as exc:  # a run directory that vanished: say so, keep going
        return ResumeChoice(None, f"cannot apply the resume rule: {exc}")
