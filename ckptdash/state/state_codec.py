"""A :class:`~ckptdash.state.RunState` as a typed snapshot body and back, exactly: the
``state`` of a snapshot (:mod:`ckptdash.state.snapshot`), encoded by msgspec.

Everything the state would need to go on replaying is kept -- per (attempt, rank) streams, the
thinned series with their metrics, each checkpoint path's events, the commands' answers, the
incident lists, the bad-line counts and samples -- so that a state restored from it and fed
the rest of the log ends where a full replay ends. What is derived from it (the public
``attempts``, ``checkpoints``, ``commands``, ``progress``, the bad-line samples) is derived
again on restore, with the reader's own confinement. Command-file sightings are left out: a
reader lists ``control/`` afresh anyway, and sees only the files there now, as a replay does;
so are the pulse records (``pulses/``), which it reads afresh too.

The body is a tree of the structs below (:class:`StateBody` at its top, with its
:data:`SCHEMA` version): events are the event schema's own structs, records the state's own
dataclasses, and msgspec checks every type while decoding, so a body of another shape (an
older format, a planted one) fails to decode and the reader replays. JSON holds no infinite
float: the times a stream has not seen yet (``inf``/``-inf``) are ``null`` in it. The state's
own methods cross the boundary (:class:`Snapshotting`, a base of RunState:
:meth:`~Snapshotting.export` and :meth:`~Snapshotting.restore`), so no private attribute of
RunState is named outside ``state/``.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar, Union

import msgspec

from ckptdash import events as ev_
from ckptdash.events import BadLine
from ckptdash.state import checkpoints as ckpt_
from ckptdash.state import commands as cmd_
from ckptdash.state import metric_points as state_metric_points
from ckptdash.state import records as rec_
from ckptdash.state import series as series_
from ckptdash.state import streams as streams_

SCHEMA: Final = 2
"""The body's version (1 was a hand-tagged JSON encoding: such a snapshot is never restored)."""

Key = tuple[float, int, int, int, bytes]
if TYPE_CHECKING:
    AnyEvent = ev_.Event
else:  # msgspec decodes a tagged union of every kind
    AnyEvent = Union[tuple(ev_.EVENT_TYPES)]  # noqa: UP007
CkptEvent = Union[  # noqa: UP007
    ev_.CheckpointStarted,
    ev_.CheckpointSaved,
    ev_.CheckpointFailed,
    ev_.CheckpointRemoved,
    ev_.CheckpointInvalid,
]
Outcome = Union[ev_.CommandApplied, ev_.CommandRejected, ev_.CommandExpired]  # noqa: UP007
Reason = Literal["corrupt", "unknown_kind", "invalid", "oversize"]
_S = TypeVar("_S", bound="Snapshotting")


class _Body(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    pass


class StreamBody(_Body):
    hb: ev_.Heartbeat | None
    hb_t: float | None  # None: -inf (and so below)
    last_t: float | None
    max_step: int
    first_hb_t: float | None  # None: inf (and so below)
    first_t: float | None
    first_save_t: float | None
    save_s: list[float]
    last_save_t: float | None
    host: str
    pulse_step: int
    step_t: float | None


class SeriesBody(_Body):
    width: float
    buckets: dict[float, tuple[float, int, msgspec.Raw]]
    lo: float
    hi: float
    min_t: float


class AttemptBody(_Body):
    info: rec_.AttemptInfo
    streams: dict[int, StreamBody]
    series: SeriesBody
    pulses: SeriesBody
    start: tuple[tuple[int, Key], ev_.RunStarted] | None
    resume: tuple[tuple[int, Key], ev_.RunResumed] | None
    end: tuple[tuple[int, float, Key], ev_.RunFinished | ev_.RunFailed] | None


class CheckpointBody(_Body):
    latest: dict[str, tuple[Key, CkptEvent]]
    saves: int
    starts: list[float]
    history: list[tuple[Key, rec_.SavedVersion]]


class CommandBody(_Body):
    received: tuple[Key, ev_.CommandReceived] | None
    outcome: tuple[Key, Outcome] | None


class StateBody(msgspec.Struct, forbid_unknown_fields=True):
    """The state a snapshot holds (see the module docstring)."""

    schema: int
    attempts: dict[int, AttemptBody]
    checkpoints: dict[str, CheckpointBody]
    commands: dict[str, CommandBody]
    last_attempt: int
    best_hb: tuple[tuple[bool, float, int, int], ev_.Heartbeat] | None
    best_other: tuple[tuple[bool, Key], AnyEvent] | None
    best_pulse: tuple[tuple[bool, float, int, int], ev_.Pulse] | None
    save_outcomes: list[tuple[Key, tuple[float, bool, int, str]]]
    logger_keys: dict[str, Key]
    bad_heap: list[tuple[str, int, Reason, str]]
    bad_counts: dict[str, int]
    event_counts: dict[str, int]
    events_total: int
    replaced: int
    checkpoint_dirs: list[str]
    signals: list[rec_.SignalInfo]
    requeues: list[rec_.RequeueInfo]
    exceptions: list[rec_.ExceptionInfo]
    anomalies: list[rec_.AnomalyInfo]
    loggers: dict[str, rec_.LoggerInfo]
    alert_log: list[rec_.AlertRecord]


class SnapshotBody(msgspec.Struct):
    """A snapshot's whole body: where the tailer stands in each event file (checked by
    :mod:`ckptdash.state.snapshot`), the writer's working folder, and the state."""

    files: dict[str, Any]
    cwd: str
    checkpoint_dirs: list[str]
    state: StateBody


_decoder = msgspec.json.Decoder(SnapshotBody)


def decode_body(body: bytes) -> SnapshotBody:
    """The body of a snapshot, every type checked (``msgspec.ValidationError`` otherwise)."""
    return _decoder.decode(body)


def fingerprint() -> str:
    """What a body depends on besides its data: the code that replays a log into a state (the
    events, the tailer, the state; their source hashed) and the body's :data:`SCHEMA`. A
    snapshot another version of that code wrote is not restored; "" where the source cannot be
    read (then no snapshot is written or read)."""
    global _fingerprint
    if _fingerprint is None:
        package = Path(__file__).resolve().parent.parent
        digest = hashlib.sha256(repr(SCHEMA).encode())
        try:
            for folder in ("events", "tail", "state"):
                for source in sorted((package / folder).glob("*.py")):
                    digest.update(source.name.encode() + b"\0" + source.read_bytes())
            _fingerprint = digest.hexdigest()[:32]
        except OSError:
            _fingerprint = ""
    return _fingerprint


_fingerprint: str | None = None


# --- the state's side ----------------------------------------------------------------------------


def _fin(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _low(x: float | None) -> float:
    return -math.inf if x is None else x


def _high(x: float | None) -> float:
    return math.inf if x is None else x


def _own(ev: Any) -> Any:
    """A decoded heartbeat's metrics are a view into the whole body: keep a copy of its own."""
    if isinstance(ev, ev_.Heartbeat):
        return msgspec.structs.replace(ev, metrics=ev.metrics.copy())
    return ev


def _stream_body(s: streams_.Stream) -> StreamBody:
    return StreamBody(
        s.hb,
        _fin(s.hb_t),
        _fin(s.last_t),
        s.max_step,
        _fin(s.first_hb_t),
        _fin(s.first_t),
        _fin(s.first_save_t),
        list(s.save_s),
        _fin(s.last_save_t),
        s.host,
        s.pulse_step,
        _fin(s.step_t),
    )


def _stream(b: StreamBody, series: series_.Series | None) -> streams_.Stream:
    s = streams_.Stream(series)
    s.hb = None if b.hb is None else _own(b.hb)
    s.hb_t, s.last_t, s.last_save_t = _low(b.hb_t), _low(b.last_t), _low(b.last_save_t)
    s.first_hb_t, s.first_t = _high(b.first_hb_t), _high(b.first_t)
    s.first_save_t, s.step_t = _high(b.first_save_t), _high(b.step_t)
    s.max_step, s.save_s, s.host, s.pulse_step = b.max_step, b.save_s, b.host, b.pulse_step
    return s


def _series_body(s: series_.Series) -> SeriesBody:
    return SeriesBody(s.width, dict(s.buckets), s.lo, s.hi, s.min_t)


def _series(b: SeriesBody) -> series_.Series:
    s = series_.Series()
    s.width, s.lo, s.hi, s.min_t = b.width, b.lo, b.hi, b.min_t
    s.buckets = {k: (t, step, raw.copy()) for k, (t, step, raw) in b.buckets.items()}
    return s


def _attempt_body(a: streams_.Attempt) -> AttemptBody:
    streams = {rank: _stream_body(s) for rank, s in a.streams.items()}
    series, pulses = _series_body(a.series), _series_body(a.pulses)
    return AttemptBody(a.info, streams, series, pulses, a.start, a.resume, a.end)


def _attempt(n: int, b: AttemptBody) -> streams_.Attempt:
    if b.info.attempt != n:
        raise ValueError(f"attempt {n} holds the record of attempt {b.info.attempt}")
    a = streams_.Attempt(n)
    a.info, a.series, a.pulses = b.info, _series(b.series), _series(b.pulses)
    # rank 0's stream feeds the attempt's series
    a.streams = {r: _stream(s, a.series if r == 0 else None) for r, s in b.streams.items()}
    a.start, a.resume, a.end = b.start, b.resume, b.end
    return a


def _checkpoint(b: CheckpointBody) -> ckpt_.Checkpoint:
    if not b.latest:
        raise ValueError("a checkpoint with no event")
    c = ckpt_.Checkpoint()
    c.latest, c.saves, c.starts, c.history = b.latest, b.saves, b.starts, b.history
    return c


def _command(b: CommandBody) -> cmd_.Command:
    if b.received is None and b.outcome is None:
        raise ValueError("a command with nothing known of it")
    c = cmd_.Command()
    c.received, c.outcome = b.received, b.outcome
    return c


class Snapshotting:
    """RunState's side of the snapshot: :meth:`export` and :meth:`restore` (a base class of
    :class:`~ckptdash.state.RunState`, kept here so the state module stays the hot path)."""

    if TYPE_CHECKING:  # what RunState holds (ckptdash/state/__init__.py)
        root: str
        run_id: str
        checkpoint_dirs: list[str]
        attempts: dict[int, rec_.AttemptInfo]
        replaced: int
        signals: list[rec_.SignalInfo]
        requeues: list[rec_.RequeueInfo]
        exceptions: list[rec_.ExceptionInfo]
        anomalies: list[rec_.AnomalyInfo]
        loggers: dict[str, rec_.LoggerInfo]
        bad_lines: rec_.BadLines
        event_counts: dict[str, int]
        events_total: int
        alert_log: list[rec_.AlertRecord]
        _logger_keys: dict[str, Key]
        _attempts: dict[int, streams_.Attempt]
        _last_attempt: int
        _best_hb: Any
        _best_other: Any
        _best_pulse: Any
        _progress_dirty: bool
        _checkpoints: dict[str, ckpt_.Checkpoint]
        _dirty_checkpoints: set[str]
        _commands: dict[str, cmd_.Command]
        _dirty_commands: set[str]
        _bad_heap: list[tuple[str, int, str, str]]
        _save_outcomes: list[tuple[Key, tuple[float, bool, int, str]]]

        def __init__(self, root: str = "", run_id: str = "", *, confine: bool = False) -> None:
            pass

        def _finish(self) -> None:
            pass

        def to_dict(self) -> dict[str, Any]:
            pass

        def attempt_times(self) -> Any:
            pass

        def save_outcomes(self) -> Any:
            pass

        def metric_heartbeats(self) -> Any:
            pass

    def export(self) -> StateBody:
        """Everything a replay would go on from, as a :class:`StateBody` (the module
        docstring says what is left out). Shares the state's immutable parts: encode it
        before the state changes again."""
        commands = {
            cid: CommandBody(c.received, c.outcome)
            for cid, c in self._commands.items()
            if c.received is not None or c.outcome is not None  # else known only from its file
        }
        return StateBody(
            schema=SCHEMA,
            attempts={n: _attempt_body(a) for n, a in self._attempts.items()},
            checkpoints={
                p: CheckpointBody(c.latest, c.saves, c.starts, c.history)
                for p, c in self._checkpoints.items()
            },
            commands=commands,
            last_attempt=self._last_attempt,
            best_hb=self._best_hb,
            best_other=self._best_other,
            best_pulse=self._best_pulse,
            save_outcomes=self._save_outcomes,
            logger_keys=self._logger_keys,
            bad_heap=self._bad_heap,  # type: ignore[arg-type]  # its reasons are BadLine's
            bad_counts=dict(self.bad_lines.counts),
            event_counts=self.event_counts,
            events_total=self.events_total,
            replaced=self.replaced,
            checkpoint_dirs=self.checkpoint_dirs,
            signals=self.signals,
            requeues=self.requeues,
            exceptions=self.exceptions,
            anomalies=self.anomalies,
            loggers=self.loggers,
            alert_log=self.alert_log,
        )

    @classmethod
    def restore(cls: type[_S], body: StateBody, root: str, run_id: str) -> _S:
        """A state confined to ``root`` with ``run_id``, as :meth:`export` saw it. Raises
        ``ValueError`` (or any error a hostile body provokes: the caller treats every
        exception as "replay instead") when the body is not one this version wrote."""
        if body.schema != SCHEMA:
            raise ValueError(f"a body of schema {body.schema}, not {SCHEMA}")
        state = cls(root, run_id, confine=True)
        state._attempts = {n: _attempt(n, a) for n, a in sorted(body.attempts.items())}
        state._checkpoints = {p: _checkpoint(c) for p, c in body.checkpoints.items()}
        state._commands = {cid: _command(c) for cid, c in body.commands.items()}
        state._last_attempt = body.last_attempt
        state._best_hb = None if body.best_hb is None else (body.best_hb[0], _own(body.best_hb[1]))
        other = body.best_other
        state._best_other = None if other is None else (other[0], _own(other[1]))
        state._best_pulse = body.best_pulse
        state._save_outcomes = body.save_outcomes
        state._logger_keys = body.logger_keys
        state._bad_heap = list(body.bad_heap)
        state.event_counts, state.events_total = body.event_counts, body.events_total
        state.replaced, state.checkpoint_dirs = body.replaced, body.checkpoint_dirs
        state.signals, state.requeues = body.signals, body.requeues
        state.exceptions, state.anomalies = body.exceptions, body.anomalies
        state.loggers, state.alert_log = body.loggers, body.alert_log
        state.bad_lines.counts = body.bad_counts
        state.bad_lines.samples = [
            BadLine(f, line, reason, detail) for f, line, reason, detail in sorted(body.bad_heap)
        ]
        state.attempts = {n: a.info for n, a in state._attempts.items()}
        state._dirty_checkpoints = set(state._checkpoints)
        state._dirty_commands = set(state._commands)
        state._progress_dirty = True
        state._finish()
        # Everything a reader asks of a state, once: a body wrong inside fails here, not later.
        state.to_dict(), state.attempt_times(), state.save_outcomes()
        # The metrics too, with a decoder of its own: the state keeps none of them decoded (a
        # follower of a folder holds many runs and shows one; a view decodes them when it shows
        # it).
        state_metric_points.MetricDecoder().decode(state.metric_heartbeats())
        return state
