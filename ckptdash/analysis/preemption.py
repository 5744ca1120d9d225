"""What preemptions cost a run, and the checkpoint interval that would cost least.

Pure functions over a run's records (:class:`RunRecords`: the dashboard's snapshot is one,
:func:`records_of` makes one from a replayed :class:`~ckptdash.state.RunState`); no Panel, no
files. ``ckptdash goodput`` prints it, :func:`ckptdash.goodput` returns it (``.preemption``).

* **Work lost per preemption**: training time from the attempt's last durable
  checkpoint (or its start, if it saved none) to the kill. A preemption caught
  by a signal save loses almost nothing; a kill without warning loses
  everything since the last periodic save.
* **Saving share**: time saves stalled training ÷ wall time of all attempts (an
  asynchronous save counts only its ``blocking_s``, not its background persist).
* **Preemption rate**: preemptions ÷ wall hours; its inverse is the mean
  time between failures *M*.
* **Young/Daly**: with a save costing *C* seconds and failures every *M*
  seconds on average, the interval that minimises expected lost work is
  Young's ``τ = sqrt(2·C·M)`` (first order); Daly's higher-order estimate is
  ``τ = sqrt(2·C·M)·(1 + ⅓·sqrt(C/2M) + C/18M) − C`` (``M`` when C ≥ 2M).
  The expected waste of an interval τ is about ``C/τ + τ/(2M)`` of the time.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from ckptdash.state.checkpoints import checkpoint_order
from ckptdash.state.records import AttemptInfo, CheckpointInfo, RequeueInfo, SignalInfo

if TYPE_CHECKING:
    from ckptdash.state import RunState


class RunRecords(Protocol):
    """What the preemption figures read of a run: its attempts (oldest first), checkpoints,
    signals and requeues."""

    @property
    def attempts(self) -> Sequence[AttemptInfo]: ...
    @property
    def checkpoints(self) -> Sequence[CheckpointInfo]: ...
    @property
    def signals(self) -> Sequence[SignalInfo]: ...
    @property
    def requeues(self) -> Sequence[RequeueInfo]: ...


@dataclass(frozen=True)
class Records:
    """A run's records as :class:`RunRecords`, copied out of a state."""

    attempts: Sequence[AttemptInfo]
    checkpoints: Sequence[CheckpointInfo]
    signals: Sequence[SignalInfo]
    requeues: Sequence[RequeueInfo]


def records_of(state: RunState) -> Records:
    """The records of a replayed run, in the order the dashboard lists them (checkpoints newest
    first)."""
    return Records(
        attempts=tuple(state.attempts[n] for n in sorted(state.attempts)),
        checkpoints=tuple(sorted(state.checkpoints.values(), key=checkpoint_order, reverse=True)),
        signals=tuple(state.signals),
        requeues=tuple(state.requeues),
    )


_PREEMPTED_REASONS = frozenset({"preempted", "terminated"})


@dataclass(frozen=True)
class Preemption:
    """One attempt that was ended by its scheduler, and how close the save came.

    Times are Unix seconds; margins are ``None`` when that step did not happen.
    """

    attempt: int
    signal: str
    signal_t: float | None
    saved_t: float | None
    """When the save after the signal was durable."""
    saved_path: str
    requeue_t: float | None
    requeue_issued: bool
    end_t: float
    """The kill: when the attempt said it ended, or its last sign of life."""
    lost_s: float
    """Training time lost: from the last durable save of this attempt (or its start) to the kill."""
    lost_steps: int | None
    warned: bool
    """True when a signal arrived before the kill (the job could save)."""

    @property
    def signal_to_save_s(self) -> float | None:
        """Margin between the signal and the durable save."""
        if self.signal_t is None or self.saved_t is None:
            return None
        return self.saved_t - self.signal_t

    @property
    def save_to_requeue_s(self) -> float | None:
        """Margin between the durable save and the requeue (issued or refused)."""
        if self.saved_t is None or self.requeue_t is None:
            return None
        return self.requeue_t - self.saved_t


@dataclass(frozen=True)
class PreemptionCost:
    """The run's goodput figures; see the module docstring for the definitions."""

    wall_s: float
    saving_s: float
    saves: int
    preemptions: tuple[Preemption, ...]
    save_cost_s: float | None
    """C: the median duration of the run's periodic saves (of all saves if none is periodic)."""
    interval_s: float | None
    """The run's own interval: the median gap between consecutive periodic saves of an attempt."""
    mtbf_s: float | None
    young_s: float | None
    daly_s: float | None

    def to_dict(self) -> dict[str, float | int | None]:
        """The ``preemption`` object of ``ckptdash goodput --json`` (docs/goodput.md)."""
        return {
            "preemptions": len(self.preemptions),
            "without_signal": self.unwarned,
            "lost_s": self.lost_s,
            "save_cost_s": self.save_cost_s,
            "interval_s": self.interval_s,
            "mtbf_s": self.mtbf_s,
            "young_s": self.young_s,
            "daly_s": self.daly_s,
        }

    @property
    def saving_share(self) -> float | None:
        return self.saving_s / self.wall_s if self.wall_s > 0 else None

    @property
    def per_hour(self) -> float | None:
        return len(self.preemptions) / (self.wall_s / 3600) if self.wall_s > 0 else None

    @property
    def lost_s(self) -> float:
        return sum(p.lost_s for p in self.preemptions)

    @property
    def unwarned(self) -> int:
        return sum(not p.warned for p in self.preemptions)

    def waste(self, interval_s: float | None) -> float | None:
        """Expected share of time lost to saving and re-doing work with this interval."""
        if interval_s is None or self.save_cost_s is None or self.mtbf_s is None:
            return None
        return expected_waste(interval_s, self.save_cost_s, self.mtbf_s)


def young_interval(cost_s: float, mtbf_s: float) -> float:
    """Young's optimal checkpoint interval ``sqrt(2·C·M)``.

    >>> round(young_interval(10.0, 3600.0))
    268
    """
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_interval(cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum (J. T. Daly, 2006); ``M`` itself when ``C ≥ 2M``."""
    if cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    r = cost_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s) * (1 + math.sqrt(r) / 3 + r / 9) - cost_s


def expected_waste(interval_s: float, cost_s: float, mtbf_s: float) -> float:
    """First-order share of time lost: saving (C/τ) plus re-done work (τ/2M)."""
    return cost_s / interval_s + interval_s / (2.0 * mtbf_s)


def preemptions(snap: RunRecords) -> list[Preemption]:
    """Every attempt that a scheduler ended: signalled, ended ``preempted``/``terminated``,
    or lost (a later attempt started though it never said it ended)."""
    out = []
    for a in snap.attempts:
        signals = sorted((s for s in snap.signals if s.attempt == a.attempt), key=lambda s: s.t)
        preempted = (
            a.outcome == "lost"
            or (a.outcome == "stopped" and a.end_reason in _PREEMPTED_REASONS)
            or (bool(signals) and a.outcome != "running")
        )
        if not preempted:
            continue
        end_t = a.ended_at if a.ended_at is not None else a.last_heartbeat_t
        if end_t is None:
            continue
        first = signals[0] if signals else None
        saves = _saves_of(snap, a)
        after = [c for c in saves if first is not None and (c.t or 0) >= first.t]
        saved = after[0] if after else None
        requeue = next(
            (
                r
                for r in sorted(snap.requeues, key=lambda r: r.t)
                if r.attempt == a.attempt and (first is None or r.t >= first.t)
            ),
            None,
        )
        durable = [c for c in saves if (c.t or 0) <= end_t]
        last = durable[-1] if durable else None
        since = last.t if last is not None and last.t is not None else a.started_at
        since = end_t if since is None else since
        base_step = last.step if last is not None else _resumed_step(snap, a)
        lost_steps = None if a.step is None or base_step is None else max(0, a.step - base_step)
        out.append(
            Preemption(
                attempt=a.attempt,
                signal=first.signal if first is not None else "",
                signal_t=first.t if first is not None else None,
                saved_t=saved.t if saved is not None else None,
                saved_path=saved.path if saved is not None else "",
                requeue_t=requeue.t if requeue is not None else None,
                requeue_issued=requeue.issued if requeue is not None else False,
                end_t=end_t,
                lost_s=max(0.0, end_t - since),
                lost_steps=lost_steps,
                warned=first is not None,
            )
        )
    return out


def compute(snap: RunRecords) -> PreemptionCost:
    """The run's goodput figures (see the module docstring)."""
    wall = 0.0
    for a in snap.attempts:
        end = a.ended_at if a.ended_at is not None else a.last_heartbeat_t
        if a.started_at is not None and end is not None:
            wall += max(0.0, end - a.started_at)
    saved = every_save(snap)
    with_duration = [c for c in saved if c.duration_s is not None and c.t is not None]
    saving = sum(_stall(c) for c in with_duration)
    saves = len(with_duration)
    periodic = [c for c in with_duration if c.trigger == "periodic"]
    # A loop's own regular saves (Monitor.save without a trigger: "api", nanoGPT's ckpt.pt
    # every eval) are its interval when it names none periodic.
    regular = periodic or [c for c in with_duration if c.trigger == "api"]
    costs = [_stall(c) for c in (periodic or with_duration)]
    cost = statistics.median(costs) if costs else None
    pre = tuple(preemptions(snap))
    mtbf = wall / len(pre) if pre and wall > 0 else None
    young = daly = None
    if cost is not None and mtbf is not None and cost > 0:
        young, daly = young_interval(cost, mtbf), daly_interval(cost, mtbf)
    return PreemptionCost(
        wall_s=wall,
        saving_s=saving,
        saves=saves,
        preemptions=pre,
        save_cost_s=cost,
        interval_s=_interval(regular),
        mtbf_s=mtbf,
        young_s=young,
        daly_s=daly,
    )


def _stall(c: CheckpointInfo) -> float:
    """What a save cost training: its stall (an asynchronous save's persist overlaps it)."""
    return c.blocking_s if c.blocking_s is not None else c.duration_s or 0.0


def every_save(snap: RunRecords) -> list[CheckpointInfo]:
    """One record per ``checkpoint_saved``: a path saved over and over (``last.ckpt``) counts
    every save, each with its own time, step, attempt and cost (:attr:`CheckpointInfo.earlier`)."""
    out: list[CheckpointInfo] = []
    for c in snap.checkpoints:
        for v in c.earlier:
            out.append(
                replace(
                    c,
                    t=v.t,
                    step=v.step,
                    attempt=v.attempt,
                    rank=v.rank,
                    trigger=v.trigger,
                    size_bytes=v.size_bytes,
                    duration_s=v.duration_s,
                    blocking_s=v.blocking_s,
                    started_at=v.t - v.duration_s,
                    replaced=0,
                    earlier=(),
                )
            )
        out.append(c)
    return out


def _saves_of(snap: RunRecords, a: AttemptInfo) -> list[CheckpointInfo]:
    """The attempt's durable saves, oldest first (whatever happened to the files later)."""
    saves = [
        c
        for c in every_save(snap)
        if c.attempt == a.attempt and c.t is not None and c.size_bytes is not None
    ]
    return sorted(saves, key=lambda c: c.t or 0.0)


def _resumed_step(snap: RunRecords, a: AttemptInfo) -> int | None:
    if a.resumed_from is None:
        return 0
    return next((c.step for c in snap.checkpoints if c.path == a.resumed_from), None)


def _interval(periodic: list[CheckpointInfo]) -> float | None:
    gaps: list[float] = []
    by_attempt: dict[int | None, list[float]] = {}
    for c in periodic:
        if c.t is not None:
            by_attempt.setdefault(c.attempt, []).append(c.t)
    for times in by_attempt.values():
        times.sort()
        gaps.extend(b - a for a, b in itertools.pairwise(times) if b > a)
    return statistics.median(gaps) if gaps else None
