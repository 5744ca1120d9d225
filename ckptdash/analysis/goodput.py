"""Goodput and badput by cause: where a run's wall-clock time went.

A pure computation over what :class:`~ckptdash.state.RunState` replays from a run's
events (no Panel, no files): the CLI (``ckptdash goodput``), the dashboard's goodput
panel and notebooks (:func:`ckptdash.goodput`) all give the same numbers. The
definitions are written down in ``docs/goodput.md`` so that another tool can too.

>>> g = ckptdash.goodput("runs/exp1")
>>> 0 < g.goodput < 1, g.badput.lost_work > 0    # a share of the wall time; seconds
(True, True)

In short, the run's wall time (first ``run_started`` to the last event, or now while
it runs) is cut into one span per attempt (its ``run_started`` to the next attempt's),
and each span into:

* ``startup``: ``run_started`` to the first heartbeat (imports, set-up, restore);
* ``saving``: the blocking time of its saves;
* ``lost_work``: for an attempt that did not complete, its last durable checkpoint
  (else its first heartbeat) to its end — the work the next attempt redoes;
* ``requeue_wait``: its end to the next attempt's ``run_started`` (the queue);
* ``other``: an attempt refused by the one-job lock (its whole life), and time
  after the last attempt said it ended;
* ``productive``: the rest.

An attempt that *finished* (completed its training) and was launched again later (a second
``ckptdash demo`` in the same folder, a new job on a finished run) asked for no requeue: the
gap to the next launch is ``idle_s``, "idle between launches", and is no part of the wall
time at all (neither badput nor productive).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from ckptdash.analysis import preemption
from ckptdash.analysis.preemption import PreemptionCost
from ckptdash.state import RunState
from ckptdash.state.records import AttemptInfo, AttemptTimes

CAUSES: Final = ("startup", "saving", "lost_work", "requeue_wait", "other")
"""The badput causes, in the order every output lists them."""

STALE_AFTER_S: Final = 600.0
"""A running attempt silent for longer than this is not counted up to *now*, only to its
last event (a job killed without warning, and never requeued, says nothing)."""

REFUSED_PREFIX: Final = "refused to start"
"""How a ``run_failed`` written by the one-job check begins (docs/format.md)."""

_DIGITS: Final = 6  # microseconds: event times carry no more (and float noise starts below)


def _r(x: float) -> float:
    return round(x, _DIGITS) + 0.0  # + 0.0: never print -0.0


@dataclass(frozen=True)
class Badput:
    """Seconds lost, by cause (see the module docstring)."""

    startup: float = 0.0
    saving: float = 0.0
    lost_work: float = 0.0
    requeue_wait: float = 0.0
    other: float = 0.0

    @property
    def total(self) -> float:
        return _r(math.fsum(self.to_dict().values()))

    def to_dict(self) -> dict[str, float]:
        """``{"startup", "saving", "lost_work", "requeue_wait", "other"}``, in that order."""
        return {c: getattr(self, c) for c in CAUSES}

    def __add__(self, other: Badput) -> Badput:
        return Badput(**{c: _r(getattr(self, c) + getattr(other, c)) for c in CAUSES})


@dataclass(frozen=True)
class AttemptGoodput:
    """One attempt's span: from its ``run_started`` to the next attempt's (or the run's end)."""

    attempt: int
    outcome: str
    """``finished`` (completed), ``stopped``, ``failed``, ``lost`` (a later attempt started
    though it never said it ended), ``running``, ``stale`` (the newest attempt, silent for
    longer than ``stale_after_s``: counted to its last event, no lost work), or ``refused``
    (the one-job check refused it)."""
    started_at: float
    ended_at: float
    """Its end: ``run_finished``/``run_failed``, else its last event (now, while it runs)."""
    wall_s: float
    productive_s: float
    goodput: float | None
    badput: Badput

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "outcome": self.outcome,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "wall_s": self.wall_s,
            "productive_s": self.productive_s,
            "goodput": self.goodput,
            "badput_s": self.badput.to_dict(),
        }


@dataclass(frozen=True)
class RunGoodput:
    """A run's goodput: the totals and one row per attempt (the rows add up to the totals)."""

    wall_s: float
    productive_s: float
    goodput: float | None
    """productive ÷ wall, 0–1; ``None`` while the wall time is 0."""
    badput: Badput
    attempts: tuple[AttemptGoodput, ...] = ()
    run: str = ""
    """The run directory (or its name), for tables of several runs."""
    run_id: str = ""
    running: bool = False
    """The newest attempt is running: the wall time ends at *now*."""
    idle_s: float = 0.0
    """Idle between launches: from a finished attempt's end to the next launch (nobody asked
    for that launch to wait; it is left out of ``wall_s``)."""
    preemption: PreemptionCost | None = None
    """What preemptions cost and the checkpoint interval that would cost least
    (:mod:`ckptdash.analysis.preemption`); ``None`` where computed from attempts alone."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON of ``ckptdash goodput --json`` (keys exactly as docs/goodput.md lists)."""
        return {
            "run": self.run,
            "run_id": self.run_id,
            "running": self.running,
            "wall_s": self.wall_s,
            "productive_s": self.productive_s,
            "goodput": self.goodput,
            "badput_s": self.badput.to_dict(),
            "attempts": [a.to_dict() for a in self.attempts],
            "idle_between_launches_s": self.idle_s,
            "preemption": None if self.preemption is None else self.preemption.to_dict(),
        }


def compute(
    attempts: Sequence[AttemptInfo],
    times: Mapping[int, AttemptTimes],
    now: float | None = None,
    *,
    stale_after_s: float = STALE_AFTER_S,
    run: str = "",
    run_id: str = "",
) -> RunGoodput:
    """Goodput of a run from its attempts (``RunState.attempts``) and their times
    (``RunState.attempt_times()``). ``now``: the clock for a running attempt (None: its last
    event). Pure: the same inputs always give the same numbers."""
    spans: list[tuple[float, AttemptInfo, AttemptTimes | None]] = []
    refused: list[AttemptGoodput] = []
    for a in attempts:
        tm = times.get(a.attempt)
        start = a.started_at if a.started_at is not None else (tm.first_t if tm else None)
        if start is None:
            continue
        if a.outcome == "failed" and a.end_reason.startswith(REFUSED_PREFIX):
            refused.append(_refused(a, start))  # it overlapped the attempt holding the run
        else:
            spans.append((start, a, tm))
    spans.sort(key=lambda x: (x[0], x[1].attempt))
    if not spans:
        return RunGoodput(0.0, 0.0, None, Badput(), tuple(refused), run, run_id, False)
    last_event = max(
        (a.last_heartbeat_t for _, a, _ in spans if a.last_heartbeat_t is not None),
        default=spans[0][0],
    )
    newest = spans[-1][1]
    silent_since = newest.last_heartbeat_t or spans[-1][0]
    open_ended = newest.ended_at is None
    running = open_ended and now is not None and now - silent_since <= stale_after_s
    run_end = max(last_event, now) if running and now is not None else last_event
    rows = []
    idle = 0.0
    for i, (start, a, tm) in enumerate(spans):
        nxt = spans[i + 1][0] if i + 1 < len(spans) else None
        span_end = max(start, nxt if nxt is not None else run_end)
        if nxt is not None and a.outcome == "finished" and a.ended_at is not None:
            # Completed, then launched again later: the gap is nobody's queue.
            end = min(max(a.ended_at, start), span_end)
            idle += span_end - end
            span_end = end
        if nxt is not None:
            outcome: str = a.outcome if a.ended_at is not None else "lost"
        elif open_ended:
            outcome = "running" if running else "stale"
        else:
            outcome = a.outcome
        rows.append(_attempt(a, tm, start, span_end, outcome, has_next=nxt is not None))
    total = Badput()
    for row in rows:
        total = total + row.badput
    wall = _r(run_end - spans[0][0] - idle)
    productive = _r(max(0.0, wall - total.total))
    return RunGoodput(
        wall_s=wall,
        productive_s=productive,
        goodput=_share(productive, wall),
        badput=total,
        attempts=tuple(sorted([*rows, *refused], key=lambda r: (r.started_at, r.attempt))),
        run=run,
        run_id=run_id,
        running=running,
        idle_s=_r(idle),
    )


def _attempt(
    a: AttemptInfo,
    tm: AttemptTimes | None,
    start: float,
    span_end: float,
    outcome: str,
    *,
    has_next: bool,
) -> AttemptGoodput:
    def clamp(t: float) -> float:
        return min(max(t, start), span_end)

    if outcome == "running":
        end = span_end
    else:
        end = clamp(a.ended_at if a.ended_at is not None else (a.last_heartbeat_t or start))
    first_step = None if tm is None or tm.first_step_t is None else clamp(tm.first_step_t)
    startup = (min(first_step, end) if first_step is not None else end) - start
    saving = tm.saving_s if tm is not None else 0.0
    lost = 0.0
    if outcome in ("stopped", "failed", "lost"):  # ended other than by completing
        last_save = None if tm is None or tm.last_save_t is None else clamp(tm.last_save_t)
        base = last_save if last_save is not None else first_step
        lost = max(0.0, end - base) if base is not None else 0.0
    tail = span_end - end
    wait, other = (tail, 0.0) if has_next else (0.0, tail)  # last: events after it ended
    bad = Badput(_r(startup), _r(saving), _r(lost), _r(wait), _r(other))
    wall = _r(span_end - start)
    productive = _r(max(0.0, wall - bad.total))
    return AttemptGoodput(
        attempt=a.attempt,
        outcome=outcome,
        started_at=start,
        ended_at=end,
        wall_s=wall,
        productive_s=productive,
        goodput=_share(productive, wall),
        badput=bad,
    )


def _refused(a: AttemptInfo, start: float) -> AttemptGoodput:
    """An attempt the one-job check refused: all of its life is ``other``. It ran beside the
    attempt that held the run, so it is listed but not added to the run's totals."""
    end = max(start, a.ended_at if a.ended_at is not None else start)
    wall = _r(end - start)
    return AttemptGoodput(
        a.attempt, "refused", start, end, wall, 0.0, _share(0.0, wall), Badput(other=wall)
    )


def _share(part: float, whole: float) -> float | None:
    return _r(part / whole) if whole > 0 else None


def of_state(
    state: RunState, now: float | None = None, *, stale_after_s: float = STALE_AFTER_S
) -> RunGoodput:
    """:func:`compute` for a replayed run state, with what its preemptions cost."""
    result = compute(
        list(state.attempts.values()),
        state.attempt_times(),
        now,
        stale_after_s=stale_after_s,
        run=state.root,
        run_id=state.run_id,
    )
    return replace(result, preemption=preemption.compute(preemption.records_of(state)))


def goodput(
    run_dir: str | os.PathLike[str],
    now: float | None = None,
    *,
    stale_after_s: float = STALE_AFTER_S,
) -> RunGoodput:
    """Replay a run directory and say where its time went (a notebook's entry point).

    ``now`` defaults to the current time (it only matters while the run is running).

    >>> g = ckptdash.goodput("runs/exp1")
    >>> print(f"lost work {g.badput.lost_work:.0f} s; {g.goodput:.0%} productive")
    lost work ... s; ...% productive
    >>> rows = [a.to_dict() for a in g.attempts]  # pd.DataFrame(rows): one row per attempt
    """
    from ckptdash.state.reading import (
        load_state,  # the state package reads files: keep import ckptdash light
    )

    state = load_state(run_dir)
    return of_state(state, time.time() if now is None else now, stale_after_s=stale_after_s)


# --- as text (``ckptdash goodput``) ------------------------------------------------------------


def _dur(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds) // 60} min {int(seconds) % 60:02d} s"
    return f"{int(seconds) // 3600} h {int(seconds) % 3600 // 60:02d} min"


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.1f} %"


def render(g: RunGoodput) -> str:
    """The run's goodput as a few lines and a table of attempts (``ckptdash goodput``)."""
    state = " (running: counted up to now)" if g.running else ""
    head = f"run {g.run_id or '?'}  {g.run}{state}"
    total = f"goodput {_pct(g.goodput)}: productive {_dur(g.productive_s)} of {_dur(g.wall_s)} wall"
    causes = "badput: " + ", ".join(
        f"{c.replace('_', ' ')} {_dur(v)}" for c, v in g.badput.to_dict().items()
    )
    header = ["attempt", "outcome", "wall", "productive", "goodput", *CAUSES]
    rows = [
        [
            str(a.attempt),
            a.outcome,
            _dur(a.wall_s),
            _dur(a.productive_s),
            _pct(a.goodput),
            *(_dur(v) for v in a.badput.to_dict().values()),
        ]
        for a in g.attempts
    ]
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    table = [fmt.format(*header), *(fmt.format(*r) for r in rows)] if rows else ["no attempts"]
    idle = (
        [f"idle between launches {_dur(g.idle_s)} (a finished run started again; not counted)"]
        if g.idle_s
        else []
    )
    advice = [] if g.preemption is None else render_preemption(g.preemption)
    return "\n".join([head, total, causes, *idle, *advice, "", *table])


def render_preemption(p: PreemptionCost) -> list[str]:
    """What preemptions cost and the interval advice, as ``ckptdash goodput`` prints them."""
    n = len(p.preemptions)
    unwarned = f" ({p.unwarned} without a signal)" if p.unwarned else ""
    lines = [f"preemptions: {n}{unwarned}, work lost {_dur(p.lost_s) if n else '-'}"]
    if p.young_s is not None and p.daly_s is not None:
        mine = _dur(p.interval_s) if p.interval_s is not None else "no periodic saves"
        lines.append(
            f"checkpoint interval: this run {mine}; Young {_dur(p.young_s)}, Daly"
            f" {_dur(p.daly_s)} (save cost {_dur(p.save_cost_s or 0.0)},"
            f" MTBF {_dur(p.mtbf_s or 0.0)})"
        )
    else:
        lines.append("checkpoint interval advice (Young/Daly): needs a preemption and a timed save")
    return lines
