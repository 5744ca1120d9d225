"""Health of a run's restart chain: detectors over the run state (pure; no Panel, no I/O).

:func:`detect` looks at a :class:`~ckptdash.state.RunState` at time ``now`` and returns the
alerts that hold, each with the kind, when it began (``since``) and a one-line detail:

* ``hung`` — no rank of the running attempt advanced its step for
  max(``hung_step_factor`` × the recent median step time, ``hung_after_s``);
* ``stale`` — the running attempt wrote no event at all for ``stale_after_s``;
* ``restart_storm`` — ``storm_attempts`` attempts started within ``storm_window_s`` without
  the newest valid checkpoint advancing;
* ``stalled_progress`` — the newest valid checkpoint's step did not advance over the last
  ``stalled_attempts`` ended attempts;
* ``budget_low`` — ``budget_low_left`` or fewer requeues left in the job's budget;
* ``save_margin_negative`` — a preemption ended an attempt before its signal save was durable
  (until a later save is);
* ``checkpoint_failures`` — ``failures_in_row`` or more failed saves in a row;
* ``crash_loop`` — the ``crash_loop_attempts`` newest attempts all failed the same way (the
  same error, numbers aside) before saving anything: a checkpoint that does not fit the
  model, a bad configuration; restarting again cannot help (ckptdash stops requeueing);
* ``lost`` — the running attempt's process is gone from its host (only when the caller
  passes what it found on this host: :mod:`ckptdash.ops.liveness`; the detectors do no I/O).

Host clocks disagree by a few seconds. Every duration that matters is measured on one
clock where it can be: how long a rank has been stuck at a step is the difference of two of
its own timestamps; only the time since its last event is measured against ``now``, and an
event from the future (a host clock ahead of ours) counts as just now.

>>> from ckptdash import load_state
>>> alerts = detect(load_state("runs/exp1"), Thresholds(hung_after_s=120))
>>> sorted({a.kind for a in alerts}) <= sorted(KINDS)
True
"""

from __future__ import annotations

import itertools
import re
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Final

from ckptdash.errors import ThresholdError as ThresholdError  # also importable from here
from ckptdash.state.records import AttemptInfo, CheckpointInfo, RankInfo, SignalInfo

if TYPE_CHECKING:
    from ckptdash.state import RunState

KINDS: Final = (
    "hung",
    "stale",
    "restart_storm",
    "stalled_progress",
    "budget_low",
    "save_margin_negative",
    "checkpoint_failures",
    "crash_loop",
    "lost",
)
"""Every detector, in the order :func:`detect` reports them."""


@dataclass(frozen=True)
class Thresholds:
    """When each detector fires. Per run in ``control/settings.json`` (``health``), or on
    the command line (``--threshold NAME=VALUE``, ``--hung-after``); the command line wins."""

    hung_after_s: float = 300.0
    """``hung`` fires after at least this long without a step on any rank."""

    hung_step_factor: float = 10.0
    """... or after this many recent median step times, whichever is longer (slow steps)."""

    stale_after_s: float = 600.0
    """``stale`` fires when the running attempt wrote nothing for this long."""

    storm_attempts: int = 3
    """``restart_storm``: this many attempts started within ``storm_window_s`` ..."""

    storm_window_s: float = 1800.0
    """... without the newest valid checkpoint advancing."""

    stalled_attempts: int = 3
    """``stalled_progress``: the newest valid checkpoint did not advance over this many ended
    attempts."""

    budget_low_left: int = 2
    """``budget_low``: this many requeues left, or fewer."""

    failures_in_row: int = 2
    """``checkpoint_failures``: this many failed saves in a row, or more."""

    crash_loop_attempts: int = 2
    """``crash_loop``: this many newest attempts failed the same way before saving anything."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ThresholdError(
                    f"health threshold {f.name} = {value!r}: must be a number >= 0"
                )
        whole = ("storm_attempts", "stalled_attempts", "failures_in_row", "crash_loop_attempts")
        for name in whole:
            if getattr(self, name) < 1 or getattr(self, name) != int(getattr(self, name)):
                raise ThresholdError(
                    f"health threshold {name} = {getattr(self, name)!r}: must be a whole number"
                    " >= 1"
                )

    def updated(self, changes: dict[str, Any], where: str = "") -> Thresholds:
        """A copy with ``changes`` applied; an unknown name raises naming ``where`` and the fix."""
        known = {f.name: f.type for f in fields(self)}
        out: dict[str, Any] = {}
        for name, value in changes.items():
            if name not in known:
                raise ThresholdError(
                    f"{where}{' ' if where else ''}unknown health threshold {name!r}; known:"
                    f" {', '.join(sorted(known))}"
                )
            try:
                out[name] = int(value) if known[name] == "int" else float(value)
            except (TypeError, ValueError):
                raise ThresholdError(
                    f"{where}{' ' if where else ''}health threshold {name} = {value!r}: must be"
                    " a number"
                ) from None
        return replace(self, **out)


def resolve_thresholds(
    run_settings: Mapping[str, Any], overrides: Mapping[str, Any], settings_file: str = ""
) -> Thresholds:
    """A run's thresholds: the defaults, then its settings' ``health`` (``run_settings``, read
    from ``settings_file``), then ``overrides`` (the command line wins). Pure: the caller reads
    the settings file; an unknown name or a bad value raises naming where it came from."""
    th = Thresholds().updated(
        dict(run_settings), where=f"{settings_file}:" if settings_file else ""
    )
    return th.updated(dict(overrides), where="command line:")


def parse_assignments(items: list[str]) -> dict[str, str]:
    """``["hung_after_s=120"]`` → ``{"hung_after_s": "120"}`` (``--threshold`` values)."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ThresholdError(
                f"--threshold {item!r}: write NAME=VALUE, e.g. --threshold hung_after_s=120"
            )
        out[name.strip()] = value.strip()
    return out


@dataclass(frozen=True)
class Alert:
    """One detector that holds now: ``since`` is when it began (Unix time), ``detail`` why."""

    kind: str
    since: float
    detail: str
    attempt: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Facts:
    """What the detectors read of a run: a copy that another thread may keep (a dashboard
    snapshot carries one, so its views can run the detectors again as the clock moves)."""

    attempts: Mapping[int, AttemptInfo]
    ranks: Sequence[RankInfo]
    """The ranks of the newest attempt."""
    series: Mapping[int, Sequence[tuple[float, int]]]
    checkpoints: Sequence[CheckpointInfo]
    signals: Sequence[SignalInfo]
    save_outcomes: Sequence[tuple[float, bool, int, str]]
    """The latest save outcomes, oldest first: (t, saved?, attempt, error)."""

    def valid_checkpoints(self) -> list[CheckpointInfo]:
        return [c for c in self.checkpoints if c.status == "saved"]


def facts_of(state: RunState) -> Facts:
    """The detectors' inputs from ``state`` (copied: the state changes in place)."""
    newest = max(state.attempts) if state.attempts else None
    return Facts(
        attempts={n: replace(a) for n, a in state.attempts.items()},
        ranks=tuple(state.rank_info(newest)) if newest is not None else (),
        series={n: tuple(p[-256:]) for n, p in state.series.items() if n == newest},
        checkpoints=tuple(replace(c) for c in state.checkpoints.values()),
        signals=tuple(state.signals),
        save_outcomes=tuple(state.save_outcomes()),
    )


def detect(
    state: RunState | Facts,
    thresholds: Thresholds | None = None,
    now: float | None = None,
    gone: Mapping[int, str] | None = None,
) -> list[Alert]:
    """The alerts that hold for ``state`` at ``now`` (default: the time now), by kind.

    ``gone``: attempts whose process the caller found gone from this host, with why
    (:func:`ckptdash.ops.liveness.gone_here`); each running one is a ``lost`` alert."""
    th = thresholds or Thresholds()
    now = time.time() if now is None else now
    if not isinstance(state, Facts):
        state = facts_of(state)
    if not state.attempts:
        return []
    newest = state.attempts[max(state.attempts)]
    found = [
        _hung(state, newest, th, now),
        _stale(newest, th, now),
        _restart_storm(state, th, now),
        _stalled_progress(state, th),
        _budget_low(state, newest, th),
        _save_margin_negative(state),
        _checkpoint_failures(state, th),
        crash_loop(state, th),
        _lost(newest, gone or {}, now),
    ]
    return [a for a in found if a is not None]


# --- the detectors -------------------------------------------------------------------------------


def median_step_s(points: Sequence[tuple[float, int]], last: int = 20) -> float | None:
    """The median seconds per step over the last ``last`` progress intervals, or None."""
    rates = []
    for (t0, s0), (t1, s1) in itertools.pairwise(points):
        if s1 > s0 and t1 > t0:
            rates.append((t1 - t0) / (s1 - s0))
    return statistics.median(rates[-last:]) if rates else None


def _hung(state: Facts, a: AttemptInfo, th: Thresholds, now: float) -> Alert | None:
    if a.outcome != "running":
        return None
    ranks = state.ranks
    stuck: list[float] = []  # per rank: seconds at its step, as of now
    step = None
    for r in ranks:
        if r.pulses and r.step_since is not None and r.last_seen is not None:
            # Own clock for the stuck time; ours only for the time since its last pulse.
            stuck.append((r.last_seen - r.step_since) + max(0.0, now - r.last_seen))
            step = r.step if step is None or (r.step or 0) > step else step
    if not stuck:
        # No pulses (an older writer): rank 0's heartbeat series is all there is.
        points = state.series.get(a.attempt, [])
        if not points:
            return None
        top = max(s for _, s in points)
        first = min(t for t, s in points if s == top)
        stuck, step = [max(0.0, now - first)], top
    median = median_step_s(state.series.get(a.attempt, []))
    limit = max(th.hung_after_s, th.hung_step_factor * median if median else 0.0)
    least = min(stuck)  # the rank that moved most recently
    # A checkpoint save has no steps: its start (and end) count as progress, so a long save is
    # not taken for a hang (and requeued by `watch --on hung=requeue`) before it had
    # `limit` seconds; a save that itself hangs for longer still is one.
    saves = [
        t
        for c in state.checkpoints
        if c.attempt == a.attempt
        for t in (c.started_at, c.t)
        if t is not None
    ]
    if saves:
        least = min(least, max(0.0, now - max(saves)))
    if least < limit:
        return None
    detail = f"no rank advanced past step {step} for {least:.0f} s (limit {limit:.0f} s"
    detail += f", median step {median:.2f} s)" if median else ")"
    return Alert("hung", now - least + limit, detail, a.attempt)


def _stale(a: AttemptInfo, th: Thresholds, now: float) -> Alert | None:
    if a.outcome != "running":
        return None
    last = a.last_heartbeat_t if a.last_heartbeat_t is not None else a.started_at
    if last is None:
        return None
    quiet = max(0.0, now - last)
    if quiet < th.stale_after_s:
        return None
    return Alert(
        "stale",
        last + th.stale_after_s,
        f"attempt {a.attempt} wrote nothing for {quiet:.0f} s (limit {th.stale_after_s:.0f} s)",
        a.attempt,
    )


def _best_step_before(state: Facts, t: float) -> int:
    """The highest step of a valid checkpoint saved before ``t`` (-1: none)."""
    steps = [c.step for c in state.valid_checkpoints() if c.t is not None and c.t < t]
    return max((s for s in steps if s is not None), default=-1)


def _restart_storm(state: Facts, th: Thresholds, now: float) -> Alert | None:
    if state.attempts[max(state.attempts)].outcome == "finished":
        return None
    started = sorted(
        (a for a in state.attempts.values() if a.started_at is not None),
        key=lambda a: a.started_at or 0.0,
    )
    recent = [
        a for a in started if a.started_at is not None and a.started_at >= now - th.storm_window_s
    ]
    n = int(th.storm_attempts)
    if len(recent) < n:
        return None
    window = recent[-n:]
    first_t = window[0].started_at or 0.0
    if _best_step_before(state, now + 1e9) > _best_step_before(state, first_t):
        return None
    best = _best_step_before(state, first_t)
    where = f"step {best}" if best >= 0 else "no valid checkpoint"
    return Alert(
        "restart_storm",
        window[-1].started_at or first_t,
        f"{n} attempts ({window[0].attempt}-{window[-1].attempt}) started within"
        f" {th.storm_window_s:.0f} s and the newest valid checkpoint stayed at {where}",
        window[-1].attempt,
    )


def _stalled_progress(state: Facts, th: Thresholds) -> Alert | None:
    ended = sorted(
        (a for a in state.attempts.values() if a.outcome != "running" and a.started_at is not None),
        key=lambda a: a.started_at or 0.0,
    )
    k = int(th.stalled_attempts)
    if len(ended) < k:
        return None
    window = ended[-k:]
    first_t = window[0].started_at or 0.0
    last = window[-1]
    end_t = last.ended_at if last.ended_at is not None else last.last_heartbeat_t or first_t
    before, after = _best_step_before(state, first_t), _best_step_before(state, end_t + 1e-6)
    if after > before:
        return None
    if last.outcome == "finished":
        return None  # training completed: nothing left to advance
    where = f"step {before}" if before >= 0 else "no valid checkpoint"
    return Alert(
        "stalled_progress",
        end_t,
        f"the newest valid checkpoint stayed at {where} over the last {k} attempts"
        f" ({window[0].attempt}-{last.attempt})",
        last.attempt,
    )


def _budget_low(state: Facts, a: AttemptInfo, th: Thresholds) -> Alert | None:
    if a.requeue_budget is None or a.outcome == "finished":
        return None
    # The budget is per job: its own restarts, not the attempts of earlier jobs in the run.
    same_job = [b for b in state.attempts.values() if a.job_id is None or b.job_id == a.job_id]
    own = sum(1 for b in same_job if b.attempt <= a.attempt) - 1
    left = max(0, a.requeue_budget - (own + 1))
    if left > th.budget_low_left:
        return None
    return Alert(
        "budget_low",
        a.started_at or 0.0,
        f"{left} requeue(s) left of a budget of {a.requeue_budget} attempts"
        " (TrainConfig.max_attempts)",
        a.attempt,
    )


def _save_margin_negative(state: Facts) -> Alert | None:
    saving = [s for s in state.signals if s.action in ("requeue", "terminate")]
    if not saving:
        return None
    sig = max(saving, key=lambda s: s.t)
    a = state.attempts.get(sig.attempt)
    if a is None or a.outcome == "running":
        return None
    saved = [
        c
        for c in state.checkpoints
        if c.attempt == sig.attempt
        and c.trigger == "signal"
        and c.status == "saved"
        and c.t is not None
        and c.t >= sig.t - 1e-6
    ]
    if saved:
        return None
    end = a.ended_at
    if end is None:  # lost: the next attempt's start is the latest it can have ended
        later = [
            b.started_at for b in state.attempts.values() if b.attempt > a.attempt and b.started_at
        ]
        end = min(later) if later else (a.last_heartbeat_t or sig.t)
    # A later durable save (any trigger) means the run has recovered.
    if any(c.t is not None and c.t > end for c in state.valid_checkpoints()):
        return None
    return Alert(
        "save_margin_negative",
        end,
        f"attempt {a.attempt} got {sig.signal} at step {sig.step} and ended ({a.outcome})"
        " before its signal save was durable: raise the signal's lead time"
        " (sbatch --signal=B:USR2@SECONDS) or make saves faster",
        a.attempt,
    )


def _checkpoint_failures(state: Facts, th: Thresholds) -> Alert | None:
    failed: list[tuple[float, bool, int, str]] = []
    for outcome in reversed(state.save_outcomes):
        if outcome[1]:
            break
        failed.append(outcome)
    if len(failed) < th.failures_in_row:
        return None
    _, _, attempt, error = failed[0]  # the latest
    # Newest first: the failure that made the run of them long enough to be an alert.
    since = failed[len(failed) - int(th.failures_in_row)][0]
    return Alert(
        "checkpoint_failures",
        since,
        f"{len(failed)} failed saves in a row: {error}",
        attempt,
    )


def failure_signature(error: str) -> str:
    """An attempt's error with the numbers taken out (addresses, pids, steps): two attempts
    that failed "the same way" have the same signature."""
    return re.sub(r"\d+", "#", error.strip())[:300]


def crash_loop(state: RunState | Facts, th: Thresholds | None = None) -> Alert | None:
    """The ``crash_loop`` alert: the newest attempts all failed the same way, none of them
    having saved a checkpoint (so restarting from the same checkpoint fails again)."""
    th = th or Thresholds()
    if not isinstance(state, Facts):
        state = facts_of(state)
    n = int(th.crash_loop_attempts)
    newest = sorted(state.attempts.values(), key=lambda a: a.attempt)[-n:]
    if len(newest) < n or any(a.outcome != "failed" for a in newest):
        return None
    if len({failure_signature(a.end_reason) for a in newest}) != 1:
        return None
    attempts = {a.attempt for a in newest}
    if any(c.attempt in attempts and c.status == "saved" for c in state.checkpoints):
        return None
    last = newest[-1]
    first = newest[0].attempt
    # A checkpoint that does not fit while an older one exists: the error names the pin,
    # and "start fresh" would throw that one away (ckptdash.train.checkpoints.misfit).
    pin = _PIN_ADVICE.search(last.end_reason)
    way_out = (
        f"pin the older checkpoint the error names: `{pin.group(1)}`"
        if pin
        else "fix the cause, or start fresh with `ckptdash resume RUN --fresh`"
    )
    return Alert(
        "crash_loop",
        last.ended_at or last.started_at or 0.0,
        f"attempts {first}-{last.attempt} failed the same way before saving anything:"
        f" {short_error(last.end_reason)}; restarting cannot help: {way_out}",
        last.attempt,
    )


_PIN_ADVICE: Final = re.compile(r"`(ckptdash resume \S+ --pin \S+)`")


def short_error(error: str, limit: int = 120) -> str:
    """An error on one short line (the status table's, an alert's detail)."""
    line = " ".join(error.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _lost(a: AttemptInfo, gone: Mapping[int, str], now: float) -> Alert | None:
    if a.outcome != "running" or a.attempt not in gone:
        return None
    return Alert("lost", a.last_heartbeat_t or now, gone[a.attempt], a.attempt)
