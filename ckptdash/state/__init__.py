"""The run state: what the dashboard shows, built only by replaying what the tailer read.

:class:`RunState` is plain data with no Panel in it. Its only inputs are
events, bad lines and command-file sightings (a :class:`~ckptdash.tail.TailBatch`),
and its result does not depend on how events of different files interleave:
a live tailer hands over pieces of files in whatever order they grew, a full
replay hands over whole files, and both give the same :meth:`RunState.to_dict`.
Every decision is therefore taken by event time ``t`` (ties broken by kind,
attempt, rank and finally the event's own bytes), never by arrival.

Open a run with :func:`ckptdash.state.reading.load_state` (confined, with its run id).
Heartbeats are almost all of a log, so their path is kept to a few attribute reads: per
(attempt, rank) only the latest heartbeat is kept, and the progress series keeps at most one
point per time bucket (:data:`~ckptdash.state.series.SERIES_POINTS`).

The bookkeeping lives in modules of one job each, which this one drives:
:mod:`~ckptdash.state.series` (the thinned progress series), :mod:`~ckptdash.state.streams`
(per attempt and rank; the event order), :mod:`~ckptdash.state.checkpoints` (what a path's
events say, confinement, the checkpoint order), :mod:`~ckptdash.state.commands`,
:mod:`~ckptdash.state.incidents` (signals, requeues, exceptions, anomalies, alerts, bad lines)
and :mod:`~ckptdash.state.records` (the plain records all of it hands out).
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final, cast

import msgspec

from ckptdash import events as ev_
from ckptdash.events import BadLine, Event, Heartbeat, Pulse
from ckptdash.state import as_dict as state_as_dict
from ckptdash.state import checkpoints as ckpt_
from ckptdash.state import commands as cmd_
from ckptdash.state import incidents as inc_
from ckptdash.state import metric_points as state_metric_points
from ckptdash.state import series as state_series
from ckptdash.state import state_codec
from ckptdash.state import streams as state_streams
from ckptdash.state.records import (
    AlertRecord,
    AnomalyInfo,
    AttemptInfo,
    AttemptTimes,
    BadLines,
    CheckpointInfo,
    CommandInfo,
    ExceptionInfo,
    LoggerInfo,
    MetricPoint,
    Progress,
    RankInfo,
    RequeueInfo,
    SignalInfo,
)

if TYPE_CHECKING:
    from ckptdash.tail import CommandFile, TailBatch

# The hot path reads these as module globals, as it did when they were defined here.
_Series = state_series.Series
_Stream = state_streams.Stream
_Attempt = state_streams.Attempt
_NO_METRICS: Final = state_series.NO_METRICS
_NEG_INF: Final = state_streams.NEG_INF
_encode = state_streams.encode
_key = state_streams.key
Key = state_streams.Key
SaveOutcome = ckpt_.SaveOutcome


# --- the state ---------------------------------------------------------------------------------


class RunState(state_codec.Snapshotting):
    """Everything known about one run, from replaying its records; see the module docstring.

    Read the public attributes; change the state only through the ``apply*``
    methods. ``series`` maps an attempt to its thinned (t, step) progress points.

    With ``confine`` (every reader of a real run directory passes it: the resume rule, the
    dashboard's follower, ``ckptdash watch``, the run guard) a checkpoint counts only where the
    run keeps them: inside ``root`` or inside a directory the run declared
    (``checkpoint_dir_declared``, listed in ``checkpoint_dirs``). A record of any other path is
    ``invalid`` with the reason — never a resume candidate, never pinnable. A state fed by hand
    (tests, tools) may leave it off.
    """

    def __init__(self, root: str = "", run_id: str = "", *, confine: bool = False) -> None:
        self.root = root
        self.run_id = run_id
        self.checkpoint_dirs: list[str] = []
        """Directories the run declared it saves checkpoints in, sorted (absolute)."""
        # The run directory as this reader spells it, and with its symbolic links resolved
        # (a login node may reach the project filesystem through a link).
        self._roots = sorted({ckpt_.norm(root), os.path.realpath(root)}) if root and confine else []
        self.attempts: dict[int, AttemptInfo] = {}
        self.checkpoints: dict[str, CheckpointInfo] = {}
        self.replaced = 0
        """Saves that replaced an earlier save of the same path (e.g. ``last.ckpt``)."""
        self.signals: list[SignalInfo] = []
        self.requeues: list[RequeueInfo] = []
        self.exceptions: list[ExceptionInfo] = []
        self.anomalies: list[AnomalyInfo] = []
        self.loggers: dict[str, LoggerInfo] = {}
        """The logger runs (TensorBoard, W&B, ...) this run's curves go to, by logger name:
        each one's newest ``logger_attached``."""
        self._logger_keys: dict[str, Key] = {}
        self.commands: dict[str, CommandInfo] = {}
        self.progress: Progress | None = None
        self.bad_lines = BadLines()
        self.event_counts: dict[str, int] = {}
        self.events_total = 0
        self.record_pulses = 0
        """Pulses read from the ranks' pulse records (not log lines: not in events_total)."""
        self._run_id_given = bool(run_id)
        self._attempts: dict[int, _Attempt] = {}
        self._touched: set[int] = set()
        self._last_attempt = -1
        # The latest heartbeat, keyed (is rank 0, t, -rank, attempt); the latest other event
        # with a step, keyed (is rank 0, its Key): together they make ``progress``.
        self._best_hb: state_streams.BestHeartbeat | None = None
        self._best_other: tuple[tuple[bool, Key], Event] | None = None
        self._progress_dirty = False
        self._checkpoints: dict[str, ckpt_.Checkpoint] = {}
        self._dirty_checkpoints: set[str] = set()
        self._commands: dict[str, cmd_.Command] = {}
        self._dirty_commands: set[str] = set()
        self._lists_dirty = False
        self._bad_heap: inc_.BadHeap = []
        self.metric_decoder = state_metric_points.MetricDecoder()
        """Decodes the kept heartbeats' metrics once each (:meth:`metrics`, the dashboard)."""
        self.alert_log: list[AlertRecord] = []
        """Alerts raised and cleared, and actions taken (``ckptdash watch``, the job's watchdog)."""
        # The latest pulse, keyed like ``_best_hb``: the 1 Hz progress the views show.
        self._best_pulse: tuple[tuple[bool, float, int, int], Pulse] | None = None
        # The latest save outcomes by event key (True: saved), for ``checkpoint_failures``.
        self._save_outcomes: list[tuple[Key, SaveOutcome]] = []

    # --- input -------------------------------------------------------------------------------

    def apply(self, batch: TailBatch) -> None:
        """Apply everything in one batch of the tailer."""
        self._apply_batch(batch)
        self._finish()

    def apply_all(self, batches: Iterable[TailBatch]) -> tuple[int, int]:
        """Apply every batch of a poll (each as it comes: one piece in memory at a time), and
        bring the derived views up to date once at the end — per batch, the first read of a
        1,024-rank run refreshed its attempt 1,024 times over 1,024 ranks. Returns how many
        records and how many command-file sightings were applied."""
        records = sightings = 0
        for batch in batches:
            self._apply_batch(batch)
            records += len(batch)
            sightings += len(batch.commands)
        self._finish()
        return records, sightings

    def _apply_batch(self, batch: TailBatch) -> None:
        for cf in batch.commands:
            self._apply_command_file(cf)
        self._apply_events(batch.events)
        for pulse in batch.pulses:  # from the pulse records: liveness, not log lines; not in
            self._apply_pulse(pulse, False)  # the series, or a follower's would hold every one
        self.record_pulses += len(batch.pulses)
        self._apply_bad(batch.bad)

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
        return ckpt_.outside(path, self.root, self._roots, self.checkpoint_dirs)

    def attempt_times(self) -> dict[int, AttemptTimes]:
        """Per attempt, the times that badput needs
        (:class:`~ckptdash.state.records.AttemptTimes`)."""
        return {n: self._attempts[n].times() for n in sorted(self._attempts)}

    def metrics(self) -> dict[int, list[MetricPoint]]:
        """Per attempt, the metrics of the heartbeats kept in :attr:`series` (thinned as
        :data:`~ckptdash.state.series.SERIES_POINTS` says), by time. A heartbeat is decoded
        once, on the first call that sees it; later calls decode only new points."""
        return self.metric_decoder.decode(self.metric_heartbeats())

    def metric_heartbeats(self) -> dict[int, tuple[tuple[float, int, msgspec.Raw], ...]]:
        """Per attempt, the kept heartbeats with their raw metrics (what :meth:`metrics`
        decodes; :class:`~ckptdash.state.metric_points.MetricPoints` decodes them lazily)."""
        out = {}
        for n in sorted(self._attempts):
            kept = tuple(self._attempts[n].series.heartbeats())
            if kept:
                out[n] = kept
        return out

    def fresh_start(self) -> AttemptInfo | None:
        """The latest attempt that started fresh (the fresh-start boundary), or None: no
        checkpoint an earlier attempt recorded is a resume candidate any more."""
        fresh = [a for a in self.attempts.values() if a.fresh]
        return max(fresh, key=lambda a: a.attempt) if fresh else None

    def valid_checkpoints(self) -> list[CheckpointInfo]:
        """Checkpoints whose file is a resume candidate, oldest first by (step, time)."""
        saved = [c for c in self.checkpoints.values() if c.status == "saved"]
        return sorted(saved, key=ckpt_.checkpoint_order)

    def to_dict(self) -> dict[str, Any]:
        """The whole state as JSON-ready builtins, in a stable order (``status --json``)."""
        return state_as_dict.as_dict(self)

    def rank_info(self, attempt: int) -> list[RankInfo]:
        """Every rank of ``attempt`` that wrote anything, by rank: host, last seen, step."""
        a = self._attempts.get(attempt)
        return [] if a is None else a.rank_info()

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
        hb_streams: list[_Stream] = []
        for ev in events:
            if type(ev) is hb_cls:
                n_hb += 1
                if ev.attempt != attempt or ev.rank != rank:
                    attempt, rank = ev.attempt, ev.rank
                    s = self._stream(attempt, rank)
                    series = s.series
                    hb_streams.append(s)
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
            # A decoded heartbeat's metrics are a view into the whole piece of log it came
            # from (up to a read, 1 MiB): the one each stream keeps gets its own copy, or every
            # run a watch holds would keep its last piece of log alive.
            for kept in hb_streams:
                hb = kept.hb
                if hb is not None:
                    kept.hb = msgspec.structs.replace(hb, metrics=hb.metrics.copy())

    def _stream(self, attempt: int, rank: int) -> _Stream:
        a = self._attempts.get(attempt)
        if a is None:
            a = self._attempts[attempt] = _Attempt(attempt)
        self._touched.add(attempt)
        s = a.streams.get(rank)
        if s is None:
            s = a.streams[rank] = _Stream(a.series if rank == 0 else None)
        return s

    def _apply_pulse(self, ev: Pulse, series_too: bool = True) -> None:
        s = self._stream(ev.attempt, ev.rank)
        s.pulse(ev)
        t = ev.t
        if ev.rank == 0 and series_too:
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
        if kind in inc_.ALERT_KINDS:
            # Written by `ckptdash watch` too: never a sign of life or progress of the attempt.
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
        self._attempts[ev.attempt].on_run_started(ev, k)

    def _on_run_resumed(self, ev: ev_.RunResumed, k: Key) -> None:
        self._attempts[ev.attempt].on_run_resumed(ev, k)

    def _on_run_ended(self, ev: ev_.RunFinished | ev_.RunFailed, k: Key) -> None:
        self._attempts[ev.attempt].on_run_ended(ev, k)

    def _on_checkpoint(self, ev: ckpt_.CkptEvent, k: Key) -> None:
        path = ev.path
        c = self._checkpoints.get(path)
        if c is None:
            c = self._checkpoints[path] = ckpt_.Checkpoint()
        slot = c.record(ev, k)
        if slot in ("saved", "failed"):
            ckpt_.push_outcome(self._save_outcomes, ev, k)
        if slot == "saved" and c.saves > 1:
            self.replaced += 1
        self._dirty_checkpoints.add(path)

    def _on_alert(self, ev: Event) -> None:
        self.alert_log.append(inc_.alert_record(ev))
        self._lists_dirty = True

    def _on_dir_declared(self, ev: ev_.CheckpointDirDeclared, k: Key) -> None:
        where = ckpt_.norm(ev.path)
        if where not in self.checkpoint_dirs:
            bisect.insort(self.checkpoint_dirs, where)
            self._dirty_checkpoints.update(self._checkpoints)  # some may count now

    def _on_signal(self, ev: ev_.SignalReceived, k: Key) -> None:
        self.signals.append(inc_.signal_info(ev))
        self._lists_dirty = True

    def _on_requeue(self, ev: ev_.RequeueIssued | ev_.RequeueSkipped, k: Key) -> None:
        self.requeues.append(inc_.requeue_info(ev))
        self._lists_dirty = True

    def _on_exception(self, ev: ev_.ExceptionRaised, k: Key) -> None:
        self.exceptions.append(inc_.exception_info(ev))
        self._lists_dirty = True

    def _on_anomaly(self, ev: ev_.AnomalyDetected, k: Key) -> None:
        self.anomalies.append(inc_.anomaly_info(ev))
        self._lists_dirty = True

    def _on_logger_attached(self, ev: ev_.LoggerAttached, k: Key) -> None:
        known = self._logger_keys.get(ev.logger)
        if known is not None and known > k:
            return
        self._logger_keys[ev.logger] = k
        self.loggers[ev.logger] = LoggerInfo(
            ev.logger, ev.id, ev.location, ev.attempt, ev.step, ev.redone, ev.named, ev.t
        )

    def _on_command_received(self, ev: ev_.CommandReceived, k: Key) -> None:
        self._command(ev.command_id).on_received(ev, k)

    def _on_command_outcome(self, ev: cmd_.Outcome, k: Key) -> None:
        self._command(ev.command_id).on_outcome(ev, k)

    def _command(self, cid: str) -> cmd_.Command:
        self._dirty_commands.add(cid)
        c = self._commands.get(cid)
        if c is None:
            c = self._commands[cid] = cmd_.Command()
        return c

    def _apply_command_file(self, cf: CommandFile) -> None:
        self._command(cf.id).file = cf

    def _apply_bad(self, bad: Iterable[BadLine]) -> None:
        inc_.count_bad(self.bad_lines, self._bad_heap, bad)

    # --- deriving the public records -----------------------------------------------------------

    def _finish(self) -> None:
        if self._touched:
            newest = max(self._attempts)
            if len(self._attempts) != len(self.attempts):  # a new attempt: keep them sorted
                self.attempts = {n: self._attempts[n].info for n in sorted(self._attempts)}
            touched = set(self._attempts) if newest != self._last_attempt else self._touched
            self._last_attempt = newest
            for n in sorted(touched):
                best = self._attempts[n].refresh(newest, self._best_hb)
                if best is not self._best_hb:
                    self._best_hb, self._progress_dirty = best, True
            self._touched.clear()
        if self._progress_dirty:
            self._refresh_progress()
        if self._dirty_checkpoints:
            for path in self._dirty_checkpoints:
                info = ckpt_.checkpoint_info(path, self._checkpoints[path])
                if why := self.outside(path):
                    info.status, info.reason = "invalid", why
                self.checkpoints[path] = info
            self._dirty_checkpoints.clear()
        if self._dirty_commands:
            for cid in self._dirty_commands:
                self.commands[cid] = cmd_.command_info(cid, self._commands[cid])
            self._dirty_commands.clear()
        if self._lists_dirty:
            self.signals.sort(key=inc_.signal_key)
            self.requeues.sort(key=inc_.requeue_key)
            self.exceptions.sort(key=inc_.exception_key)
            self.anomalies.sort(key=inc_.anomaly_key)
            self.alert_log.sort(key=inc_.alert_key)
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

    def _refresh_progress(self) -> None:
        self._progress_dirty = False
        p = state_streams.progress_of(self._best_hb, self._best_other, self._best_pulse)
        if p is not None:
            self.progress = p


_HANDLERS: Final[dict[str, Any]] = {
    "run_started": RunState._on_run_started,
    "run_resumed": RunState._on_run_resumed,
    "run_finished": RunState._on_run_ended,
    "run_failed": RunState._on_run_ended,
    **{kind: RunState._on_checkpoint for kind in ckpt_.CKPT_SLOT},
    "checkpoint_dir_declared": RunState._on_dir_declared,
    "signal_received": RunState._on_signal,
    "requeue_issued": RunState._on_requeue,
    "requeue_skipped": RunState._on_requeue,
    "command_received": RunState._on_command_received,
    **{kind: RunState._on_command_outcome for kind in cmd_.COMMAND_OUTCOMES},
    "exception": RunState._on_exception,
    "anomaly": RunState._on_anomaly,
    "logger_attached": RunState._on_logger_attached,
}
