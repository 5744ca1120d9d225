"""The per-attempt and per-rank bookkeeping of :class:`~ckptdash.state.RunState`: the event
order every decision uses, one :class:`Stream` per (attempt, rank) holding its latest heartbeat,
one :class:`Attempt` per attempt, and the records derived from them (:class:`AttemptInfo`,
:class:`RankInfo`, :class:`AttemptTimes`, :class:`Progress`).

Every choice here is by event time and :data:`Key`, never by arrival, so the result does not
depend on how the files' events interleave.
"""

from __future__ import annotations

import math
from typing import Final, TypeAlias

import msgspec

from ckptdash import events as ev_
from ckptdash.events import Event, Heartbeat, Pulse
from ckptdash.state.records import AttemptInfo, AttemptTimes, Progress, RankInfo
from ckptdash.state.series import Series

NEG_INF: Final = -math.inf
_KIND_ORDER: Final = {cls.KIND: i for i, cls in enumerate(ev_.EVENT_TYPES)}
encode = msgspec.json.Encoder().encode

Key: TypeAlias = tuple[float, int, int, int, bytes]
"""A total order on events: (t, kind, attempt, rank, the event's JSON)."""

BestHeartbeat: TypeAlias = tuple[tuple[bool, float, int, int], Heartbeat]
"""The run's latest heartbeat, keyed (is rank 0, t, -rank, attempt)."""


def key(event: Event) -> Key:
    """The event's place in :data:`Key` order."""
    return (event.t, _KIND_ORDER[event.KIND], event.attempt, event.rank, encode(event))


def opt(value: int | None) -> int:
    """A step for comparing: -1 for none."""
    return -1 if value is None else value


class Stream:
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

    def __init__(self, series: Series | None) -> None:
        self.hb: Heartbeat | None = None
        self.hb_t = NEG_INF
        self.last_t = NEG_INF
        self.max_step = -1
        self.series = series
        # For badput (ckptdash.analysis.goodput): first events, and the blocking time of each save.
        self.first_hb_t = self.first_t = self.first_save_t = math.inf
        self.save_s: list[float] = []
        self.last_save_t = NEG_INF
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
        if self.hb is None or encode(hb) > encode(self.hb):
            self.hb = hb


class Attempt:
    """One attempt: its streams by rank, its series, and its chosen start, resume and end."""

    __slots__ = ("end", "info", "pulses", "resume", "series", "start", "streams")

    def __init__(self, attempt: int) -> None:
        self.info = AttemptInfo(attempt)
        self.streams: dict[int, Stream] = {}
        self.series = Series()
        # Rank 0's pulses, thinned apart from the heartbeats: a pulse has no metrics, and in
        # one series its 1 Hz points would push the heartbeats' metrics out of every bucket.
        self.pulses = Series()
        # Chosen among ranks by (rank, t): rank 0's word wins; the earliest start, the last end
        # (but the first run_failed of any rank, see on_run_ended).
        self.start: tuple[tuple[int, Key], ev_.RunStarted] | None = None
        self.resume: tuple[tuple[int, Key], ev_.RunResumed] | None = None
        self.end: tuple[tuple[int, float, Key], ev_.RunFinished | ev_.RunFailed] | None = None

    def on_run_started(self, ev: ev_.RunStarted, k: Key) -> None:
        if self.start is None or (ev.rank, k) < self.start[0]:
            self.start = ((ev.rank, k), ev)

    def on_run_resumed(self, ev: ev_.RunResumed, k: Key) -> None:
        if self.resume is None or (ev.rank, k) < self.resume[0]:
            self.resume = ((ev.rank, k), ev)

    def on_run_ended(self, ev: ev_.RunFinished | ev_.RunFailed, k: Key) -> None:
        # A failure on any rank fails the attempt, and the first one is its cause (the other
        # ranks' errors are then often "connection closed by peer"); else rank 0's last end.
        pref = (-1, ev.t, k) if isinstance(ev, ev_.RunFailed) else (ev.rank, -ev.t, k)
        if self.end is None or pref < self.end[0]:
            self.end = (pref, ev)

    def refresh(self, newest: int, best_hb: BestHeartbeat | None) -> BestHeartbeat | None:
        """Bring :attr:`info` up to date (``newest``: the run's newest attempt); returns the
        run's latest heartbeat, ``best_hb`` itself unless one of this attempt's is later."""
        info = self.info
        n = info.attempt
        if self.start is not None:
            st = self.start[1]
            info.host, info.scheduler, info.job_id = st.host, st.scheduler, st.job_id
            info.world_size, info.pid, info.started_at = st.world_size, st.pid, st.t
            info.max_steps, info.requeue_budget = st.max_steps, st.requeue_budget
            info.fresh = st.fresh
        if self.resume is not None:
            info.resumed_from, info.resume_reason = self.resume[1].path, self.resume[1].reason
        if self.end is not None:
            end = self.end[1]
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
        last, step = NEG_INF, -1
        best: tuple[tuple[bool, float, int], Heartbeat] | None = None  # rank 0, else the latest
        for rank, s in self.streams.items():
            last = max(last, s.last_t, s.hb_t)
            step = max(step, s.max_step)
            if s.hb is None:
                continue
            step = max(step, opt(s.hb.step))
            k = (rank == 0, s.hb_t, -rank)
            if best is None or k > best[0]:
                best = (k, s.hb)
            # An equal key is this same stream, whose heartbeat may have changed on a tie in t.
            if (
                best_hb is None
                or (*k, n) > best_hb[0]
                or ((*k, n) == best_hb[0] and s.hb is not best_hb[1])
            ):
                best_hb = ((*k, n), s.hb)
        info.last_heartbeat_t = None if last == NEG_INF else last
        info.step = None if step < 0 else step
        info.ranks = sorted(self.streams)
        if best is not None:
            hb = best[1]
            info.epoch, info.time_left_s = hb.epoch, hb.time_left_s
            # The start's host, else the best heartbeat's: never whichever came first.
            info.host = (self.start[1].host if self.start is not None else "") or hb.host
        return best_hb

    def rank_info(self) -> list[RankInfo]:
        """Every rank that wrote anything, by rank: host, last seen, step."""
        out = []
        for rank in sorted(self.streams):
            s = self.streams[rank]
            last = max(s.last_t, s.hb_t)
            step = max(s.max_step, opt(None if s.hb is None else s.hb.step))
            host = s.host or (s.hb.host if s.hb is not None else "")
            if not host and rank == 0 and self.start is not None:
                host = self.start[1].host
            out.append(
                RankInfo(
                    rank,
                    host,
                    None if last == NEG_INF else last,
                    None if step < 0 else step,
                    None if s.step_t == math.inf else s.step_t,
                    s.step_t != math.inf,
                )
            )
        return out

    def times(self) -> AttemptTimes:
        """The times that badput needs (:class:`~ckptdash.state.records.AttemptTimes`)."""
        streams = self.streams.values()
        first = min((min(s.first_t, s.first_hb_t) for s in streams), default=0.0)
        # The first step: its first heartbeat, or its first save's start if that came first.
        first_hb = min((min(s.first_hb_t, s.first_save_t) for s in streams), default=math.inf)
        # fsum: exact, so the total does not depend on the order the saves arrived in.
        per_rank = [(math.fsum(s.save_s), len(s.save_s)) for s in streams]
        saving, saves = max(per_rank, default=(0.0, 0))
        last_save = max((s.last_save_t for s in streams), default=NEG_INF)
        return AttemptTimes(
            attempt=self.info.attempt,
            first_t=None if math.isinf(first) else first,
            first_step_t=None if math.isinf(first_hb) else first_hb,
            saving_s=saving,
            saves=saves,
            last_save_t=None if last_save == NEG_INF else last_save,
        )


def progress_of(
    best_hb: BestHeartbeat | None,
    best_other: tuple[tuple[bool, Key], Event] | None,
    best_pulse: tuple[tuple[bool, float, int, int], Pulse] | None,
) -> Progress | None:
    """The run's progress from its latest heartbeat, its latest other event with a step and
    its latest pulse (each keyed rank 0 first); None where they say nothing new."""
    hb = None if best_hb is None else best_hb[1]
    if hb is None:
        if best_other is None and best_pulse is None:
            return None
        o = best_other[1] if best_other is not None else best_pulse[1]  # type: ignore[index]
        if o.step is None and best_other is None:
            return None
        p = Progress(o.t, o.attempt, o.rank, o.step, None, None, {})
    else:
        metrics = dict(sorted(ev_.decode_metrics(hb.metrics).items()))
        p = Progress(hb.t, hb.attempt, hb.rank, hb.step, hb.epoch, hb.time_left_s, metrics)
        if best_other is not None:
            o = best_other[1]
            if o.t > hb.t and (o.rank == 0 or p.rank != 0):
                p.t, p.attempt, p.rank, p.step = o.t, o.attempt, o.rank, o.step
    if best_pulse is not None:
        # The pulse (about 1 Hz, every rank) is the freshest word on the step.
        pl = best_pulse[1]
        if pl.t > p.t and pl.step is not None and (pl.rank == 0 or p.rank != 0):
            p.t, p.attempt, p.rank, p.step = pl.t, pl.attempt, pl.rank, pl.step
    return p
