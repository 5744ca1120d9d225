"""The incident lists of :class:`~ckptdash.state.RunState` (signals, requeues, exceptions,
anomalies, the alert log) and its skipped-line samples: one record per event, each list kept
in one total order so that the state does not depend on the order events arrived in.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any, Final, Literal, TypeAlias, cast

from ckptdash import events as ev_
from ckptdash.events import BadLine, Event
from ckptdash.state.records import (
    AlertRecord,
    AnomalyInfo,
    BadLines,
    ExceptionInfo,
    RequeueInfo,
    SignalInfo,
)
from ckptdash.state.streams import opt

BAD_LINE_SAMPLES: Final = 20
ALERT_KINDS: Final = frozenset({"alert_raised", "alert_cleared", "action_taken"})
"""Written by `ckptdash watch` too: never a sign of life or progress of the attempt."""
_Reason: TypeAlias = 'Literal["corrupt", "unknown_kind", "invalid", "oversize"]'
BadHeap: TypeAlias = list[tuple[str, int, str, str]]


def alert_record(ev: Event) -> AlertRecord:
    """The alert log's record of an ``alert_raised``/``alert_cleared``/``action_taken``."""
    if isinstance(ev, ev_.AlertRaised):
        rec = AlertRecord(ev.t, "alert_raised", ev.alert, ev.attempt, ev.source, ev.who, ev.detail)
        rec.since = ev.since
    elif isinstance(ev, ev_.AlertCleared):
        rec = AlertRecord(ev.t, "alert_cleared", ev.alert, ev.attempt, ev.source, ev.who, ev.detail)
    else:
        assert isinstance(ev, ev_.ActionTaken)
        rec = AlertRecord(ev.t, "action_taken", ev.alert, ev.attempt, ev.source, ev.who, ev.result)
        rec.action, rec.command, rec.ok = ev.action, ev.command, ev.ok
    return rec


def signal_info(ev: ev_.SignalReceived) -> SignalInfo:
    return SignalInfo(ev.t, ev.attempt, ev.rank, ev.step, ev.signal, ev.action)


def requeue_info(ev: ev_.RequeueIssued | ev_.RequeueSkipped) -> RequeueInfo:
    if isinstance(ev, ev_.RequeueIssued):
        return RequeueInfo(ev.t, ev.attempt, ev.rank, True, ev.job_id, ev.command, "")
    return RequeueInfo(ev.t, ev.attempt, ev.rank, False, None, "", ev.reason)


def exception_info(ev: ev_.ExceptionRaised) -> ExceptionInfo:
    return ExceptionInfo(
        ev.t, ev.attempt, ev.rank, ev.step, ev.error_type, ev.message, ev.traceback
    )


def anomaly_info(ev: ev_.AnomalyDetected) -> AnomalyInfo:
    return AnomalyInfo(
        ev.t, ev.attempt, ev.step, ev.metric, ev.value, ev.reason, ev.action, ev.pinned
    )


def alert_key(x: AlertRecord) -> tuple[Any, ...]:
    return (x.t, x.event, x.alert, x.attempt, x.source, x.who, x.detail, x.action, x.command)


def signal_key(x: SignalInfo) -> tuple[Any, ...]:
    return (x.t, x.attempt, x.rank, opt(x.step), x.signal, x.action)


def requeue_key(x: RequeueInfo) -> tuple[Any, ...]:
    return (x.t, x.attempt, x.rank, x.issued, x.job_id or "", x.command, x.reason)


def exception_key(x: ExceptionInfo) -> tuple[Any, ...]:
    return (x.t, x.attempt, x.rank, opt(x.step), x.error_type, x.message, x.traceback)


def anomaly_key(x: AnomalyInfo) -> tuple[Any, ...]:
    return (x.t, x.attempt, repr(x))


def count_bad(bad_lines: BadLines, heap: BadHeap, bad: Iterable[BadLine]) -> None:
    """Count skipped lines into ``bad_lines``; its samples are the last
    :data:`BAD_LINE_SAMPLES` by (file, line), kept in ``heap``."""
    counts = bad_lines.counts
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
        bad_lines.samples = [
            BadLine(f, line, cast("_Reason", reason), detail)
            for f, line, reason, detail in sorted(heap)
        ]
