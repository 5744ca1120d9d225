"""The run state: what the dashboard shows, built only by replaying what the tailer read.

:class:`RunState` is plain data with no Panel in it. Its only inputs are
events, bad lines and command-file sightings (a :class:`~ckptdash.tail.TailBatch`),
and its result does not depend on how events of different files interleave:
a live tailer hands over pieces of files in whatever order they grew, a full
replay hands over whole files, and both give the same :meth:`RunState.to_dict`.
Every decision is therefore taken by event time ``t`` (ties broken by kind,
attempt, rank and finally the event's own bytes), never by arrival.

>>> state = RunState("runs/exp1")                   # doctest: +SKIP
>>> for batch in RunTailer("runs/exp1").batches():
...     state.apply(batch)
>>> state.valid_checkpoints()[-1].path
'checkpoints/step=1200.ckpt'

Heartbeats are almost all of a log, so their path is kept to a few attribute
reads: per (attempt, rank) only the latest heartbeat is kept, and the progress
series keeps at most one point per time bucket (see :data:`SERIES_POINTS`).
"""

from __future__ import annotations

import bisect
import heapq
import math
import os
from collections.abc import Iterable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias, cast

import msgspec

from ckptdash import events as ev_
from ckptdash.events import BadLine, Event, Heartbeat, Pulse
from ckptdash.records import (
    AlertRecord,
    AnomalyInfo,
    AttemptInfo,
    AttemptTimes,
    BadLines,
    CheckpointInfo,
    CommandInfo,
    ExceptionInfo,
    MetricPoint,
    Progress,
    RankInfo,
    RequeueInfo,
    SignalInfo,
)

if TYPE_CHECKING:
    from ckptdash.tail import CommandFile, TailBatch

SERIES_POINTS: Final = 2048
"""Most points kept per attempt in the progress series.

A point is the earliest rank-0 heartbeat in its time bucket; buckets start at
1 s and double in width whenever an attempt would hold more points than this.
The result depends only on the set of heartbeats, not on their order. The kept
heartbeats' metrics are the metrics plot's points (:meth:`RunState.metrics`).
"""

BAD_LINE_SAMPLES: Final = 20
_NEG_INF: Final = -math.inf
_KIND_ORDER: Final = {cls.KIND: i for i, cls in enumerate(ev_.EVENT_TYPES)}
_encode = msgspec.json.Encoder().encode

Key = tuple[float, int, int, int, bytes]
"""A total order on events: (t, kind, attempt, rank, the event's JSON)."""


def _key(event: Event) -> Key:
    return (event.t, _KIND_ORDER[event.KIND], event.attempt, event.rank, _encode(event))


# --- accumulators (private; order-independent by construction) --------------------------------


_NO_METRICS: Final = msgspec.Raw(b"{}")


class _Series:
    """Earliest (t, step) per time bucket, with its heartbeat's metrics; the bucket width
    doubles to stay under a cap. The metrics are copied: a heartbeat read from a file is a view
    into the whole buffer it was decoded from, which would stay in memory with it."""

    __slots__ = ("buckets", "hi", "lo", "min_t", "width")

    def __init__(self) -> None:
        self.width = 1.0
        self.buckets: dict[float, tuple[float, int, msgspec.Raw]] = {}
        # The bucket the last point fell in: a heartbeat later than its minimum changes nothing.
        self.lo = self.hi = self.min_t = 0.0

    def add(self, t: float, step: int | None, metrics: msgspec.Raw) -> None:
        if step is None:
            return
        b = t // self.width
        old = self.buckets.get(b)
        if (
            old is None
            or (t, step) < old[:2]
            or ((t, step) == old[:2] and bytes(metrics) > bytes(old[2]))  # order-independent
        ):
            self.buckets[b] = (t, step, metrics.copy())
            while len(self.buckets) > SERIES_POINTS:
                self.width *= 2  # powers of two: bucket floor(t/2w) is the union of two old ones
                merged: dict[float, tuple[float, int, msgspec.Raw]] = {}
                for point in self.buckets.values():
                    nb = point[0] // self.width
                    if nb not in merged or point[:2] < merged[nb][:2]:
                        merged[nb] = point
                self.buckets = merged
            b = t // self.width
        self.lo, self.hi = b * self.width, (b + 1) * self.width
        self.min_t = self.buckets[b][0]

    def points(self) -> list[tuple[float, int]]:
        return sorted(p[:2] for p in self.buckets.values())

    def heartbeats(self) -> list[tuple[float, int, msgspec.Raw]]:
        return sorted(self.buckets.values(), key=lambda p: p[:2])


class _Stream:
    """Per (attempt, rank): its latest heartbeat and a summary of its other events."""

    __slots__ = (
        "first_hb_t",
        "first_save_t",
        "first_t",
        "hb",
        "hb_t",
        "host",
        "last_save_t",
        "last_t",
        "max_step",
        "pulse_step",
        "save_s",
        "series",
        "step_t",
    )

    def __init__(self, series: _Series | None) -> None:
        self.hb: Heartbeat | None = None
        self.hb_t = _NEG_INF
        self.last_t = _NEG_INF
        self.max_step = -1
        self.series = series
        # For badput (ckptdash.badput): first events, and the blocking time of each save.
        self.first_hb_t = self.first_t = self.first_save_t = math.inf
        self.save_s: list[float] = []
        self.last_save_t = _NEG_INF
        self.host = ""
        # Pulses: the highest step seen and the earliest time it was seen (order-independent).
        self.pulse_step = -1
        self.step_t = math.inf

    def pulse(self, ev: Pulse) -> None:
        t, step = ev.t, -1 if ev.step is None else ev.step
        if t > self.last_t:
            self.last_t = t
            self.host = ev.host
        if step > self.pulse_step:
            self.pulse_step, self.step_t = step, t
        elif step == self.pulse_step and t < self.step_t:
            self.step_t = t
        if step > self.max_step:
            self.max_step = step

    def tie(self, hb: Heartbeat) -> None:
        """Two heartbeats at one time: keep the greater bytes, whichever came first."""
        if self.hb is None or _encode(hb) > _encode(self.hb):
            self.hb = hb


class _Attempt:
    __slots__ = ("end", "info", "pulses", "resume", "series", "start", "streams")

    def __init__(self, attempt: int) -> None:
        self.info = AttemptInfo(attempt)
        self.streams: dict[int, _Stream] = {}
        self.series = _Series()
        # Rank 0's pulses, thinned apart from the heartbeats: a pulse has no metrics, and in
        # one series its 1 Hz points would push the heartbeats' metrics out of every bucket.
        self.pulses = _Series()
        # Chosen among ranks by (rank, t): rank 0's word wins; the earliest start, the last end
        # (but the first run_failed of any rank, see _on_run_ended).
        self.start: tuple[tuple[int, Key], ev_.RunStarted] | None = None
        self.resume: tuple[tuple[int, Key], ev_.RunResumed] | None = None
        self.end: tuple[tuple[int, float, Key], ev_.RunFinished | ev_.RunFailed] | None = None


class _Checkpoint:
    __slots__ = ("latest", "saves", "starts")

    def __init__(self) -> None:
        self.latest: dict[str, tuple[Key, _CkptEvent]] = {}  # "started"/"saved"/"failed"/"gone"
        self.saves = 0
        self.starts: list[float] = []


class _Command:
    __slots__ = ("file", "outcome", "received")

    def __init__(self) -> None:
        self.file: CommandFile | None = None
        self.received: tuple[Key, ev_.CommandReceived] | None = None  # the earliest
        self.outcome: tuple[Key, _Outcome] | None = None  # the latest


_Outcome: TypeAlias = "ev_.CommandApplied | ev_.CommandRejected | ev_.CommandExpired"
_CkptEvent: TypeAlias = (
    "ev_.CheckpointStarted | ev_.CheckpointSaved | ev_.CheckpointFailed"
    " | ev_.CheckpointRemoved | ev_.CheckpointInvalid"
)
_Reason: TypeAlias = 'Literal["corrupt", "unknown_kind", "invalid", "oversize"]'
_CKPT_SLOT: Final = {
    "checkpoint_started": "started",
    "checkpoint_saved": "saved",
    "checkpoint_failed": "failed",
    "checkpoint_removed": "gone",
    "checkpoint_invalid": "gone",
}
_COMMAND_OUTCOMES: Final = {"command_applied", "command_rejected", "command_expired"}
_ALERT_KINDS: Final = frozenset({"alert_raised", "alert_cleared", "action_taken"})
SAVE_OUTCOMES: Final = 16
SaveOutcome: TypeAlias = tuple[float, bool, int, str]
"""One save's outcome: (t, saved?, attempt, error of a failed save)."""


# --- the state ---------------------------------------------------------------------------------


class RunState:
    """Everything known about one run, from replaying its records; see the module docstring.

    Read the public attributes; change the state only through the ``apply*``
    methods. ``series`` maps an attempt to its thinned (t, step) progress points.

    With ``confine`` (every reader of a real run directory passes it: the resume rule, the
    watcher, the run guard) a checkpoint counts only where the run keeps them: inside
    ``root`` or inside a directory the run declared (``checkpoint_dir_declared``, listed in
    ``checkpoint_dirs``). A record of any other path is ``invalid`` with the reason — never
    a resume candidate, never pinnable. A state fed by hand (tests, tools) may leave it off.
    """

    def __init__(self, root: str = "", run_id: str = "", *, confine: bool = False) -> None:
        self.root = root
        self.run_id = run_id
        self.checkpoint_dirs: list[str] = []
        """Directories the run declared it saves checkpoints in, sorted (absolute)."""
        # The run directory as this reader spells it, and with its symbolic links resolved
        # (a login node may reach the project filesystem through a link).
        self._roots = sorted({_norm(root), os.path.realpath(root)}) if root and confine else []
        self.attempts: dict[int, AttemptInfo] = {}
        self.checkpoints: dict[str, CheckpointInfo] = {}
        self.replaced = 0
        """Saves that replaced an earlier save of the same path (e.g. ``last.ckpt``)."""
        self.signals: list[SignalInfo] = []
        self.requeues: list[RequeueInfo] = []
        self.exceptions: list[ExceptionInfo] = []
        self.anomalies: list[AnomalyInfo] = []
        self.commands: dict[str, CommandInfo] = {}
        self.progress: Progress | None = None
        self.bad_lines = BadLines()
        self.event_counts: dict[str, int] = {}
        self.events_total = 0
        self._run_id_given = bool(run_id)
        self._attempts: dict[int, _Attempt] = {}
        self._touched: set[int] = set()
        self._last_attempt = -1
        # The latest heartbeat, keyed (is rank 0, t, -rank, attempt); the latest other event
        # with a step, keyed (is rank 0, its Key): together they make ``progress``.
        self._best_hb: tuple[tuple[bool, float, int, int], Heartbeat] | None = None
        self._best_other: tuple[tuple[bool, Key], Event] | None = None
        self._progress_dirty = False
        self._checkpoints: dict[str, _Checkpoint] = {}
        self._dirty_checkpoints: set[str] = set()
        self._commands: dict[str, _Command] = {}
        self._dirty_commands: set[str] = set()
        self._lists_dirty = False
        self._bad_heap: list[tuple[str, int, str, str]] = []
        self._decoded: dict[int, tuple[msgspec.Raw, MetricPoint]] = {}
        self.alert_log: list[AlertRecord] = []
        """Alerts raised and cleared, and actions taken (``ckptdash watch``, the job's watchdog)."""
        # The latest pulse, keyed like ``_best_hb``: the 1 Hz progress the views show.
        self._best_pulse: tuple[tuple[bool, float, int, int], Pulse] | None = None
        # The latest save outcomes by event key (True: saved), for ``checkpoint_failures``.
        self._save_outcomes: list[tuple[Key, SaveOutcome]] = []

    # --- input -------------------------------------------------------------------------------

    def apply(self, batch: TailBatch) -> None:
        """Apply everything in one batch of the tailer."""
        for cf in batch.commands:
            self._apply_command_file(cf)
        self._apply_events(batch.events)
        self._apply_bad(batch.bad)
        self._finish()

    def apply_events(self, events: Iterable[Event]) -> None:
        """Apply events, in any order and any grouping."""
        self._apply_events(events)
        self._finish()

    def apply_command_file(self, cf: CommandFile) -> None:
        """Apply one sighting of a command file (the latest sighting of an id counts)."""
        self._apply_command_file(cf)
        self._finish()

    def apply_bad(self, bad: Iterable[BadLine]) -> None:
        """Count skipped lines."""
        self._apply_bad(bad)
        self._finish()

    # --- output ------------------------------------------------------------------------------

    @property
    def series(self) -> dict[int, list[tuple[float, int]]]:
        """Per attempt, the thinned (t, step) points of its rank-0 heartbeats and pulses."""
        out = {}
        for n in sorted(self._attempts):
            a = self._attempts[n]
            points = sorted(a.series.points() + a.pulses.points())
            if points:
                out[n] = points
        return out

    def outside(self, path: str) -> str:
        """Why ``path`` is not where this run keeps checkpoints ("" when it is, or when the
        state is not confined to a run directory)."""
        if not self._roots:
            return ""
        # ckptdash records absolute paths; another writer's relative one is read as relative
        # to the run directory, and may not leave it through "..".
        where = _norm(os.path.join(self.root, path))
        for base in (*self._roots, *self.checkpoint_dirs):
            if where == base or where.startswith(base.rstrip(os.sep) + os.sep):
                return ""
        return (
            f"{path} lies outside the run directory and every checkpoint folder this run"
            " declared; not this run's checkpoint (a forged or stray record)"
        )

    def attempt_times(self) -> dict[int, AttemptTimes]:
        """Per attempt, the times that badput needs (:class:`~ckptdash.records.AttemptTimes`)."""
        out = {}
        for n in sorted(self._attempts):
            a = self._attempts[n]
            first = min((min(s.first_t, s.first_hb_t) for s in a.streams.values()), default=0.0)
            # The first step: its first heartbeat, or its first save's start if that came first.
            first_hb = min(
                (min(s.first_hb_t, s.first_save_t) for s in a.streams.values()), default=math.inf
            )
            # fsum: exact, so the total does not depend on the order the saves arrived in.
            per_rank = [(math.fsum(s.save_s), len(s.save_s)) for s in a.streams.values()]
            saving, saves = max(per_rank, default=(0.0, 0))
            last_save = max((s.last_save_t for s in a.streams.values()), default=_NEG_INF)
            out[n] = AttemptTimes(
                attempt=n,
                first_t=None if math.isinf(first) else first,
                first_step_t=None if math.isinf(first_hb) else first_hb,
                saving_s=saving,
                saves=saves,
                last_save_t=None if last_save == _NEG_INF else last_save,
            )
        return out

    def metrics(self) -> dict[int, list[MetricPoint]]:
        """Per attempt, the metrics of the heartbeats kept in :attr:`series` (thinned as
        :data:`SERIES_POINTS` says), by time. A heartbeat is decoded once, on the first call
        that sees it; later calls decode only new points."""
        out = {}
        cache, fresh = self._decoded, {}
        for n in sorted(self._attempts):
            points = []
            for t, step, raw in self._attempts[n].series.heartbeats():
                hit = cache.get(id(raw))
                if hit is None or hit[0] is not raw:
                    hit = (raw, MetricPoint(step, t, n, ev_.decode_metrics(raw)))
                fresh[id(raw)] = hit
                points.append(hit[1])
            if points:
                out[n] = points
        self._decoded = fresh  # only what is still kept
        return out

    def valid_checkpoints(self) -> list[CheckpointInfo]:
        """Checkpoints whose file is a resume candidate, oldest first by (step, time)."""
        saved = [c for c in self.checkpoints.values() if c.status == "saved"]
        return sorted(saved, key=lambda c: (-1 if c.step is None else c.step, c.t or 0.0, c.path))

    def to_dict(self) -> dict[str, Any]:
        """The whole state as JSON-ready builtins, in a stable order (``status --json``)."""
        return {
            "root": self.root,
            "run_id": self.run_id,
            "events_total": self.events_total,
            "event_counts": dict(sorted(self.event_counts.items())),
            "bad_lines": {
                "counts": dict(sorted(self.bad_lines.counts.items())),
                "samples": [asdict(b) for b in self.bad_lines.samples],
            },
            "progress": None if self.progress is None else asdict(self.progress),
            "attempts": {str(n): asdict(self.attempts[n]) for n in sorted(self.attempts)},
            "series": {str(n): [list(p) for p in pts] for n, pts in self.series.items()},
            "checkpoints": {p: asdict(self.checkpoints[p]) for p in sorted(self.checkpoints)},
            "checkpoint_dirs": list(self.checkpoint_dirs),
            "replaced": self.replaced,
            "signals": [asdict(x) for x in self.signals],
            "requeues": [asdict(x) for x in self.requeues],
            "exceptions": [asdict(x) for x in self.exceptions],
            "anomalies": [asdict(x) for x in self.anomalies],
            "commands": {i: asdict(self.commands[i]) for i in sorted(self.commands)},
            "ranks": {
                str(n): [asdict(r) for r in self.rank_info(n)] for n in sorted(self._attempts)
            },
            "alert_log": [asdict(x) for x in self.alert_log],
        }

    def rank_info(self, attempt: int) -> list[RankInfo]:
        """Every rank of ``attempt`` that wrote anything, by rank: host, last seen, step."""
        a = self._attempts.get(attempt)
        if a is None:
            return []
        out = []
        for rank in sorted(a.streams):
            s = a.streams[rank]
            last = max(s.last_t, s.hb_t)
            step = max(s.max_step, _opt(None if s.hb is None else s.hb.step))
            host = s.host or (s.hb.host if s.hb is not None else "")
            if not host and rank == 0 and a.start is not None:
                host = a.start[1].host
            out.append(
                RankInfo(
                    rank,
                    host,
                    None if last == _NEG_INF else last,
                    None if step < 0 else step,
                    None if s.step_t == math.inf else s.step_t,
                    s.step_t != math.inf,
                )
            )
        return out

    def save_outcomes(self) -> list[SaveOutcome]:
        """The latest save outcomes, oldest first: (t, saved?, attempt, error); at most 16."""
        return [out for _, out in sorted(self._save_outcomes)]

    # --- the hot path ------------------------------------------------------------------------

    def _apply_events(self, events: Iterable[Event]) -> None:
        hb_cls = Heartbeat
        pulse_cls = Pulse
        n_pulse = 0
        other = self._apply_other
        attempt = rank = -1
        s = _Stream(None)
        series: _Series | None = None
        n_hb = 0
        for ev in events:
            if type(ev) is hb_cls:
                n_hb += 1
                if ev.attempt != attempt or ev.rank != rank:
                    attempt, rank = ev.attempt, ev.rank
                    s = self._stream(attempt, rank)
                    series = s.series
                t = ev.t
                if t > s.hb_t:
                    s.hb_t = t
                    s.hb = ev
                elif t == s.hb_t:
                    s.tie(ev)
                if t < s.first_hb_t:
                    s.first_hb_t = t
                if series is not None and not (series.lo <= t < series.hi and t > series.min_t):
                    series.add(t, ev.step, ev.metrics)
            elif type(ev) is pulse_cls:
                n_pulse += 1
                self._apply_pulse(ev)
            else:
                other(ev)
        if n_pulse:
            self.event_counts["pulse"] = self.event_counts.get("pulse", 0) + n_pulse
            self.events_total += n_pulse
        if n_hb:
            self.event_counts["heartbeat"] = self.event_counts.get("heartbeat", 0) + n_hb
            self.events_total += n_hb

    def _stream(self, attempt: int, rank: int) -> _Stream:
        a = self._attempts.get(attempt)
        if a is None:
            a = self._attempts[attempt] = _Attempt(attempt)
        self._touched.add(attempt)
        s = a.streams.get(rank)
        if s is None:
            s = a.streams[rank] = _Stream(a.series if rank == 0 else None)
        return s

    def _apply_pulse(self, ev: Pulse) -> None:
        s = self._stream(ev.attempt, ev.rank)
        s.pulse(ev)
        t = ev.t
        if ev.rank == 0:
            series = self._attempts[ev.attempt].pulses
            if not (series.lo <= t < series.hi and t > series.min_t):
                series.add(t, ev.step, _NO_METRICS)
        key = (ev.rank == 0, t, -ev.rank, ev.attempt)
        best = self._best_pulse
        if best is None or key > best[0] or (key == best[0] and _encode(ev) > _encode(best[1])):
            self._best_pulse = (key, ev)
            self._progress_dirty = True

    # --- everything else ---------------------------------------------------------------------

    def _apply_other(self, ev: Event) -> None:
        kind = ev.KIND
        self.event_counts[kind] = self.event_counts.get(kind, 0) + 1
        self.events_total += 1
        if kind in _ALERT_KINDS:
            # Written by watchers too: never a sign of life or progress of the attempt.
            self._on_alert(ev)
            return
        s = self._stream(ev.attempt, ev.rank)
        s.last_t = max(s.last_t, ev.t)
        s.first_t = min(s.first_t, ev.t)
        if kind == "checkpoint_saved":
            sv = cast("ev_.CheckpointSaved", ev)
            # An asynchronous save stalls training for less than it takes to be durable.
            s.save_s.append(sv.duration_s if sv.blocking_s is None else sv.blocking_s)
            s.first_save_t = min(s.first_save_t, ev.t - sv.duration_s)
            s.last_save_t = max(s.last_save_t, ev.t)
        k = _key(ev)
        if ev.step is not None:
            s.max_step = max(s.max_step, ev.step)
            pk = (ev.rank == 0, k)
            if self._best_other is None or pk > self._best_other[0]:
                self._best_other = (pk, ev)
                self._progress_dirty = True
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, ev, k)

    def _on_run_started(self, ev: ev_.RunStarted, k: Key) -> None:
        a = self._attempts[ev.attempt]
        if a.start is None or (ev.rank, k) < a.start[0]:
            a.start = ((ev.rank, k), ev)

    def _on_run_resumed(self, ev: ev_.RunResumed, k: Key) -> None:
        a = self._attempts[ev.attempt]
        if a.resume is None or (ev.rank, k) < a.resume[0]:
            a.resume = ((ev.rank, k), ev)

    def _on_run_ended(self, ev: ev_.RunFinished | ev_.RunFailed, k: Key) -> None:
        a = self._attempts[ev.attempt]
        # A failure on any rank fails the attempt, and the first one is its cause (the other
        # ranks' errors are then often "connection closed by peer"); else rank 0's last end.
        pref = (-1, ev.t, k) if isinstance(ev, ev_.RunFailed) else (ev.rank, -ev.t, k)
        if a.end is None or pref < a.end[0]:
            a.end = (pref, ev)

    def _on_checkpoint(self, ev: _CkptEvent, k: Key) -> None:
        path = ev.path
        c = self._checkpoints.get(path)
        if c is None:
            c = self._checkpoints[path] = _Checkpoint()
        slot = _CKPT_SLOT[ev.KIND]
        old = c.latest.get(slot)
        if old is None or k > old[0]:
            c.latest[slot] = (k, ev)
        if slot in ("saved", "failed"):
            outcomes = self._save_outcomes
            error = ev.error if isinstance(ev, ev_.CheckpointFailed) else ""
            item = (k, (ev.t, slot == "saved", ev.attempt, error))
            if len(outcomes) < SAVE_OUTCOMES:
                heapq.heappush(outcomes, item)
            else:
                heapq.heappushpop(outcomes, item)  # keeps the latest
        if slot == "saved":
            c.saves += 1
            if c.saves > 1:
                self.replaced += 1
        elif slot == "started":
            bisect.insort(c.starts, ev.t)
        self._dirty_checkpoints.add(path)

    def _on_alert(self, ev: Event) -> None:
        if isinstance(ev, ev_.AlertRaised):
            rec = AlertRecord(ev.t, ev.KIND, ev.alert, ev.attempt, ev.source, ev.who, ev.detail)
            rec.since = ev.since
        elif isinstance(ev, ev_.AlertCleared):
            rec = AlertRecord(ev.t, ev.KIND, ev.alert, ev.attempt, ev.source, ev.who, ev.detail)
        else:
            assert isinstance(ev, ev_.ActionTaken)
            rec = AlertRecord(ev.t, ev.KIND, ev.alert, ev.attempt, ev.source, ev.who, ev.result)
            rec.action, rec.command, rec.ok = ev.action, ev.command, ev.ok
        self.alert_log.append(rec)
        self._lists_dirty = True

    def _on_dir_declared(self, ev: ev_.CheckpointDirDeclared, k: Key) -> None:
        where = _norm(ev.path)
        if where not in self.checkpoint_dirs:
            bisect.insort(self.checkpoint_dirs, where)
            self._dirty_checkpoints.update(self._checkpoints)  # some may count now

    def _on_signal(self, ev: ev_.SignalReceived, k: Key) -> None:
        self.signals.append(SignalInfo(ev.t, ev.attempt, ev.rank, ev.step, ev.signal, ev.action))
        self._lists_dirty = True

    def _on_requeue(self, ev: ev_.RequeueIssued | ev_.RequeueSkipped, k: Key) -> None:
        if isinstance(ev, ev_.RequeueIssued):
            info = RequeueInfo(ev.t, ev.attempt, ev.rank, True, ev.job_id, ev.command, "")
        else:
            info = RequeueInfo(ev.t, ev.attempt, ev.rank, False, None, "", ev.reason)
        self.requeues.append(info)
        self._lists_dirty = True

    def _on_exception(self, ev: ev_.ExceptionRaised, k: Key) -> None:
        self.exceptions.append(
            ExceptionInfo(
                ev.t, ev.attempt, ev.rank, ev.step, ev.error_type, ev.message, ev.traceback
            )
        )
        self._lists_dirty = True

    def _on_anomaly(self, ev: ev_.AnomalyDetected, k: Key) -> None:
        self.anomalies.append(
            AnomalyInfo(
                ev.t, ev.attempt, ev.step, ev.metric, ev.value, ev.reason, ev.action, ev.pinned
            )
        )
        self._lists_dirty = True

    def _on_command_received(self, ev: ev_.CommandReceived, k: Key) -> None:
        c = self._command(ev.command_id)
        if c.received is None or k < c.received[0]:
            c.received = (k, ev)

    def _on_command_outcome(self, ev: _Outcome, k: Key) -> None:
        # The first outcome is the command's: a later one (a replayed file rejected) must not
        # turn an applied command into a rejected one.
        c = self._command(ev.command_id)
        if c.outcome is None or k < c.outcome[0]:
            c.outcome = (k, ev)

    def _command(self, cid: str) -> _Command:
        self._dirty_commands.add(cid)
        c = self._commands.get(cid)
        if c is None:
            c = self._commands[cid] = _Command()
        return c

    def _apply_command_file(self, cf: CommandFile) -> None:
        self._command(cf.id).file = cf

    def _apply_bad(self, bad: Iterable[BadLine]) -> None:
        counts, heap = self.bad_lines.counts, self._bad_heap
        changed = False
        for b in bad:
            counts[b.reason] = counts.get(b.reason, 0) + 1
            item = (b.file, b.line, b.reason, b.detail)
            if len(heap) < BAD_LINE_SAMPLES:
                heapq.heappush(heap, item)
            else:
                heapq.heappushpop(heap, item)  # keeps the greatest (file, line): the last ones
            changed = True
        if changed:
            self.bad_lines.samples = [
                BadLine(f, line, cast("_Reason", reason), detail)
                for f, line, reason, detail in sorted(heap)
            ]

    # --- deriving the public records -----------------------------------------------------------

    def _finish(self) -> None:
        if self._touched:
            newest = max(self._attempts)
            if len(self._attempts) != len(self.attempts):  # a new attempt: keep them sorted
                self.attempts = {n: self._attempts[n].info for n in sorted(self._attempts)}
            touched = set(self._attempts) if newest != self._last_attempt else self._touched
            self._last_attempt = newest
            for n in sorted(touched):
                self._refresh_attempt(self._attempts[n], newest)
            self._touched.clear()
        if self._progress_dirty:
            self._refresh_progress()
        if self._dirty_checkpoints:
            for path in self._dirty_checkpoints:
                info = _checkpoint_info(path, self._checkpoints[path])
                if why := self.outside(path):
                    info.status, info.reason = "invalid", why
                self.checkpoints[path] = info
            self._dirty_checkpoints.clear()
        if self._dirty_commands:
            for cid in self._dirty_commands:
                self.commands[cid] = _command_info(cid, self._commands[cid])
            self._dirty_commands.clear()
        if self._lists_dirty:
            self.signals.sort(key=_signal_key)
            self.requeues.sort(key=_requeue_key)
            self.exceptions.sort(key=_exception_key)
            self.anomalies.sort(key=lambda x: (x.t, x.attempt, repr(x)))
            self.alert_log.sort(key=_alert_key)
            self._lists_dirty = False
        if not self._run_id_given:
            self.run_id = self._derive_run_id()

    def _derive_run_id(self) -> str:
        for n in sorted(self._attempts):
            start = self._attempts[n].start
            if start is not None:
                return start[1].run
        if self._best_hb is not None:
            return self._best_hb[1].run
        return "" if self._best_other is None else self._best_other[1].run

    def _refresh_attempt(self, a: _Attempt, newest: int) -> None:
        info = a.info
        n = info.attempt
        if a.start is not None:
            st = a.start[1]
            info.host, info.scheduler, info.job_id = st.host, st.scheduler, st.job_id
            info.world_size, info.pid, info.started_at = st.world_size, st.pid, st.t
            info.max_steps, info.requeue_budget = st.max_steps, st.requeue_budget
        if a.resume is not None:
            info.resumed_from, info.resume_reason = a.resume[1].path, a.resume[1].reason
        if a.end is not None:
            end = a.end[1]
            info.ended_at = end.t
            if isinstance(end, ev_.RunFailed):
                info.outcome, info.end_reason = "failed", end.error
            else:
                # "completed: <why>" (e.g. early stopping) is a finished run that says why.
                done = end.reason == "completed" or end.reason.startswith("completed:")
                info.outcome = "finished" if done else "stopped"
                info.end_reason = end.reason
        else:
            info.outcome = "lost" if n < newest else "running"
        last, step = _NEG_INF, -1
        best: tuple[tuple[bool, float, int], Heartbeat] | None = None  # rank 0, else the latest
        for rank, s in a.streams.items():
            last = max(last, s.last_t, s.hb_t)
            step = max(step, s.max_step)
            if s.hb is None:
                continue
            step = max(step, _opt(s.hb.step))
            key = (rank == 0, s.hb_t, -rank)
            if best is None or key > best[0]:
                best = (key, s.hb)
            best_hb = self._best_hb
            # An equal key is this same stream, whose heartbeat may have changed on a tie in t.
            if (
                best_hb is None
                or (*key, n) > best_hb[0]
                or ((*key, n) == best_hb[0] and s.hb is not best_hb[1])
            ):
                self._best_hb = ((*key, n), s.hb)
                self._progress_dirty = True
        info.last_heartbeat_t = None if last == _NEG_INF else last
        info.step = None if step < 0 else step
        info.ranks = sorted(a.streams)
        if best is not None:
            hb = best[1]
            info.epoch, info.time_left_s = hb.epoch, hb.time_left_s
            info.host = info.host or hb.host

    def _refresh_progress(self) -> None:
        self._progress_dirty = False
        hb = None if self._best_hb is None else self._best_hb[1]
        other = self._best_other
        if hb is None:
            if other is None and self._best_pulse is None:
                return
            o = other[1] if other is not None else self._best_pulse[1]  # type: ignore[index]
            if o.step is None and other is None:
                return
            p = Progress(o.t, o.attempt, o.rank, o.step, None, None, {})
        else:
            metrics = dict(sorted(ev_.decode_metrics(hb.metrics).items()))
            p = Progress(hb.t, hb.attempt, hb.rank, hb.step, hb.epoch, hb.time_left_s, metrics)
            if other is not None:
                o = other[1]
                if o.t > hb.t and (o.rank == 0 or p.rank != 0):
                    p.t, p.attempt, p.rank, p.step = o.t, o.attempt, o.rank, o.step
        if self._best_pulse is not None:
            # The pulse (about 1 Hz, every rank) is the freshest word on the step.
            pl = self._best_pulse[1]
            if pl.t > p.t and pl.step is not None and (pl.rank == 0 or p.rank != 0):
                p.t, p.attempt, p.rank, p.step = pl.t, pl.attempt, pl.rank, pl.step
        self.progress = p


def _norm(path: str) -> str:
    return os.path.normpath(os.path.abspath(path))


def _opt(value: int | None) -> int:
    return -1 if value is None else value


def _alert_key(x: AlertRecord) -> tuple[Any, ...]:
    return (x.t, x.event, x.alert, x.attempt, x.source, x.who, x.detail, x.action, x.command)


def _signal_key(x: SignalInfo) -> tuple[Any, ...]:
    return (x.t, x.attempt, x.rank, _opt(x.step), x.signal, x.action)


def _requeue_key(x: RequeueInfo) -> tuple[Any, ...]:
    return (x.t, x.attempt, x.rank, x.issued, x.job_id or "", x.command, x.reason)


def _exception_key(x: ExceptionInfo) -> tuple[Any, ...]:
    return (x.t, x.attempt, x.rank, _opt(x.step), x.error_type, x.message, x.traceback)


def _checkpoint_info(path: str, c: _Checkpoint) -> CheckpointInfo:
    latest = c.latest
    saved, gone, failed = latest.get("saved"), latest.get("gone"), latest.get("failed")
    started = latest.get("started")
    last = max(latest.values(), key=lambda item: item[0])[1]
    valid = saved is not None and (gone is None or saved[0] > gone[0])
    if isinstance(last, ev_.CheckpointRemoved | ev_.CheckpointInvalid):
        status = last.KIND.removeprefix("checkpoint_")
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
    if not isinstance(base, ev_.CheckpointRemoved | ev_.CheckpointInvalid):
        info.trigger = base.trigger
    if saved is not None:
        sv = cast("ev_.CheckpointSaved", saved[1])
        info.epoch, info.t, info.size_bytes = sv.epoch, sv.t, sv.size_bytes
        info.duration_s, info.checksum = sv.duration_s, sv.checksum
        info.blocking_s = sv.duration_s if sv.blocking_s is None else sv.blocking_s
        i = bisect.bisect_right(c.starts, sv.t)  # its checkpoint_started, if it wrote one
        info.started_at = c.starts[i - 1] if i else sv.t - sv.duration_s
    elif c.starts:
        info.started_at = c.starts[-1]
    if failed is not None and (saved is None or failed[0] > saved[0]):
        info.error = cast("ev_.CheckpointFailed", failed[1]).error
    return info


def _command_info(cid: str, c: _Command) -> CommandInfo:
    info = CommandInfo(cid, "pending")
    f = c.file
    if f is not None:
        info.location = f.location
        if f.command is not None:
            cmd = f.command
            info.command, info.author, info.host = cmd.NAME, cmd.author, cmd.host
            info.issued_at, info.expires_at = cmd.t, cmd.expires_at
        info.error = f.error or ""
    if c.received is not None:
        rec = c.received[1]
        info.received_at, info.attempt = rec.t, rec.attempt
        info.command = info.command or rec.command
    if c.outcome is not None:
        out = c.outcome[1]
        info.status = out.KIND.removeprefix("command_")
        info.resolved_at, info.attempt = out.t, out.attempt
        info.command = info.command or out.command
        if isinstance(out, ev_.CommandApplied):
            info.detail = out.detail
        else:
            info.reason = out.reason
    elif f is not None and f.error is not None:
        info.status = "malformed"
    elif c.received is not None or (f is not None and f.location != "inbox"):
        info.status = "received"
    return info


_HANDLERS: Final[dict[str, Any]] = {
    "run_started": RunState._on_run_started,
    "run_resumed": RunState._on_run_resumed,
    "run_finished": RunState._on_run_ended,
    "run_failed": RunState._on_run_ended,
    **{kind: RunState._on_checkpoint for kind in _CKPT_SLOT},
    "checkpoint_dir_declared": RunState._on_dir_declared,
    "signal_received": RunState._on_signal,
    "requeue_issued": RunState._on_requeue,
    "requeue_skipped": RunState._on_requeue,
    "command_received": RunState._on_command_received,
    **{kind: RunState._on_command_outcome for kind in _COMMAND_OUTCOMES},
    "exception": RunState._on_exception,
    "anomaly": RunState._on_anomaly,
}
