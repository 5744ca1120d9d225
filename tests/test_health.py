"""Health detectors over hand-written event logs (ckptdash.analysis.health), including skewed
clocks."""

from __future__ import annotations

from typing import Any

import pytest

from ckptdash import events as ev
from ckptdash.analysis.health import Alert, ThresholdError, Thresholds, detect, parse_assignments
from ckptdash.state import RunState

T0 = 1_764_430_000.0
TH = Thresholds(hung_after_s=60, stale_after_s=120)


class Log:
    """A hand-written event log: attempts, pulses, saves; replayed into a RunState."""

    def __init__(self) -> None:
        self.events: list[ev.Event] = []

    def add(self, cls: type[ev.Event], t: float, *, attempt: int = 0, rank: int = 0,
            host: str = "n0", step: int | None = None, **fields: Any) -> Log:  # fmt: skip
        self.events.append(
            cls(t=T0 + t, run="r", attempt=attempt, rank=rank, host=host, step=step, **fields)
        )
        return self

    def start(self, t: float, attempt: int = 0, **fields: Any) -> Log:
        fields.setdefault("scheduler", "slurm")
        fields.setdefault("job_id", "77")
        return self.add(ev.RunStarted, t, attempt=attempt, **fields)

    def end(self, t: float, attempt: int = 0, reason: str = "preempted") -> Log:
        return self.add(ev.RunFinished, t, attempt=attempt, reason=reason)

    def fail(self, t: float, attempt: int = 0) -> Log:
        return self.add(ev.RunFailed, t, attempt=attempt, error="ImportError: boom")

    def pulses(self, t0: float, t1: float, steps: list[int] | int, *, attempt: int = 0,
               rank: int = 0, host: str = "n0", skew: float = 0.0) -> Log:  # fmt: skip
        """One pulse a second from t0 to t1; ``steps``: one per pulse, or a fixed step."""
        n = int(t1 - t0) + 1
        seq = steps if isinstance(steps, list) else [steps] * n
        for i, step in enumerate(seq):
            self.add(ev.Pulse, t0 + i + skew, attempt=attempt, rank=rank, host=host, step=step)
        return self

    def saved(self, t: float, step: int, attempt: int = 0, trigger: str = "periodic") -> Log:
        return self.add(
            ev.CheckpointSaved, t, attempt=attempt, step=step, path=f"c/step={step}.ckpt",
            trigger=trigger, size_bytes=10, duration_s=0.1,
        )  # fmt: skip

    def failed(self, t: float, step: int, attempt: int = 0) -> Log:
        return self.add(
            ev.CheckpointFailed, t, attempt=attempt, step=step, path=f"c/step={step}.ckpt",
            trigger="periodic", error="OSError: disk full",
        )  # fmt: skip

    def state(self) -> RunState:
        s = RunState("r")
        s.apply_events(self.events)
        return s

    def kinds(self, at: float, th: Thresholds = TH) -> list[str]:
        return [a.kind for a in detect(self.state(), th, now=T0 + at)]

    def alert(self, kind: str, at: float, th: Thresholds = TH) -> Alert:
        (found,) = [a for a in detect(self.state(), th, now=T0 + at) if a.kind == kind]
        return found


def two_ranks_training(until: float) -> Log:
    """Attempt 0 on two nodes, both ranks a step a second up to ``until``."""
    log = Log().start(0, world_size=2)
    steps = list(range(int(until) + 1))
    return log.pulses(0, until, steps, rank=0, host="n0").pulses(0, until, steps, rank=1, host="n1")


# --- hung ---------------------------------------------------------------------------------------


def test_hung_when_no_rank_advances_for_hung_after() -> None:
    """Both ranks keep pulsing at step 30 from t=30: hung fires once 60 s have passed, since
    the step stopped plus the limit, naming the step."""
    log = two_ranks_training(30).pulses(31, 85, 30, rank=0).pulses(31, 85, 30, rank=1, host="n1")
    assert "hung" not in log.kinds(at=85)
    log.pulses(86, 100, 30, rank=0).pulses(86, 100, 30, rank=1, host="n1")
    alert = log.alert("hung", at=100)
    assert alert.since == pytest.approx(T0 + 30 + 60)
    assert "step 30" in alert.detail


def test_not_hung_while_one_rank_still_advances() -> None:
    """Progress on any rank keeps hung off (the issue: 'no step progress on any rank')."""
    log = two_ranks_training(30).pulses(31, 100, 30, rank=0)
    log.pulses(31, 100, list(range(31, 101)), rank=1, host="n1")
    assert "hung" not in log.kinds(at=100)


def test_hung_waits_for_k_times_the_median_step() -> None:
    """Slow steps (20 s each) stretch the limit to 10 x 20 s = 200 s, above hung_after_s."""
    log = Log().start(0)
    for i in range(6):
        log.add(ev.Pulse, i * 20.0, step=i)
    log.pulses(101, 250, 5)
    assert "hung" not in log.kinds(at=250)  # 150 s at step 5 < 200 s
    log.pulses(251, 310, 5)
    assert "hung" in log.kinds(at=310)


def test_a_long_save_is_not_a_hang_but_a_save_that_hangs_is() -> None:
    """Steps stop at 30 because a save starts then: its start restarts the hung clock, so hung
    waits for hung_after_s after the save began, not after the last step."""
    log = two_ranks_training(30).add(
        ev.CheckpointStarted, 30.5, step=30, path="c/big.ckpt", trigger="periodic"
    )
    log.pulses(31, 100, 30, rank=0).pulses(31, 100, 30, rank=1, host="n1")
    assert "hung" not in log.kinds(at=85)  # 54.5 s into the save
    assert log.alert("hung", at=100).since == pytest.approx(T0 + 30.5 + 60)


def test_hung_and_stale_only_while_the_attempt_runs() -> None:
    """A finished attempt is neither hung nor stale, however old its last pulse."""
    log = two_ranks_training(30).end(31, reason="completed")
    assert log.kinds(at=10_000) == []


def test_clock_ahead_does_not_hide_a_hang_and_behind_does_not_invent_one() -> None:
    """Rank 1's host clock is 5 s ahead, rank 0's 5 s behind: a stuck time is measured on each
    rank's own clock, so hung fires at the same moment as with agreeing clocks, and a run that
    advances is not hung although its pulses look 5 s old (or from the future)."""
    moving = Log().start(0, world_size=2)
    moving.pulses(0, 100, list(range(101)), rank=0, skew=-5.0)
    moving.pulses(0, 100, list(range(101)), rank=1, host="n1", skew=+5.0)
    assert moving.kinds(at=100) == []

    def stuck(until: int) -> Log:
        log = Log().start(0, world_size=2)
        log.pulses(0, until, [min(i, 30) for i in range(until + 1)], rank=0, skew=-5.0)
        log.pulses(0, until, [min(i, 30) for i in range(until + 1)], rank=1, host="n1", skew=+5.0)
        return log

    assert "hung" not in stuck(85).kinds(at=85)
    assert "hung" in stuck(91).kinds(at=91)


def test_hung_from_heartbeats_when_the_writer_has_no_pulses() -> None:
    """A log from a writer without pulses: rank 0's heartbeats show the step stopped."""
    log = Log().start(0)
    for i in range(0, 100, 10):
        log.add(ev.Heartbeat, float(i), step=min(i, 20))
    assert "hung" in log.kinds(at=100)
    assert "hung" not in log.kinds(at=70)


# --- stale --------------------------------------------------------------------------------------


def test_stale_after_silence_and_clock_ahead_counts_as_now() -> None:
    """No event for stale_after_s: stale, since last event + limit. Events stamped in our
    future by a fast host clock count as just now, never as a negative silence."""
    log = two_ranks_training(10)
    assert "stale" not in log.kinds(at=120)
    alert = log.alert("stale", at=140)
    assert alert.since == pytest.approx(T0 + 10 + 120)
    assert "stale" not in log.kinds(at=5)  # our clock behind theirs: not stale


# --- restart storm / stalled progress -----------------------------------------------------------


def crash_loop(n: int, gap: float = 60.0) -> Log:
    """Attempt 0 saves step 10, then ``n`` attempts that fail at start-up, ``gap`` apart."""
    log = Log().start(0).pulses(0, 10, list(range(11))).saved(10, 10).end(11)
    for a in range(1, n + 1):
        log.start(a * gap, attempt=a).fail(a * gap + 2, attempt=a)
    return log


def test_restart_storm_needs_n_attempts_in_the_window_without_progress() -> None:
    """Three attempts within 30 min that never got past step 10: restart_storm. Two crashed
    restarts are not: the three latest attempts include the one that saved step 10."""
    assert "restart_storm" not in crash_loop(2).kinds(at=130)
    alert = crash_loop(3).alert("restart_storm", at=190)
    assert alert.since == pytest.approx(T0 + 180) and "step 10" in alert.detail


def test_no_storm_when_attempts_are_spread_out_or_progress() -> None:
    """Restarts an hour apart are not a storm; a new valid checkpoint in the window ends it."""
    assert "restart_storm" not in crash_loop(3, gap=3600).kinds(at=3 * 3600 + 10)
    log = crash_loop(3).saved(185, 20, attempt=3)
    assert "restart_storm" not in log.kinds(at=190)


def test_stalled_progress_over_k_ended_attempts() -> None:
    """Three ended attempts without a newer valid checkpoint: stalled_progress; finished runs and
    runs that advanced are not."""
    assert "stalled_progress" not in crash_loop(2).kinds(at=200)
    assert "stalled_progress" in crash_loop(3, gap=3600).kinds(at=4 * 3600)
    advancing = Log()
    for a in range(3):
        advancing.start(a * 100, attempt=a).saved(a * 100 + 50, a * 10 + 10, attempt=a)
        advancing.end(a * 100 + 60, attempt=a)
    assert "stalled_progress" not in advancing.kinds(at=400)


# --- budget, save margin, failures -------------------------------------------------------------


def test_budget_low_counts_this_jobs_attempts_only() -> None:
    """Budget 5: after the third attempt of job 77, two requeues are left; an earlier job's
    attempts in the same run directory do not count."""
    log = Log().start(0, attempt=0, job_id="10", requeue_budget=5).end(1)
    log.start(10, attempt=1, requeue_budget=5).end(11, attempt=1)
    assert "budget_low" not in log.kinds(at=12)
    log.start(20, attempt=2, requeue_budget=5).end(21, attempt=2)
    log.start(30, attempt=3, requeue_budget=5)
    alert = log.alert("budget_low", at=31)
    assert "2 requeue(s) left" in alert.detail and alert.attempt == 3


def test_save_margin_negative_when_the_signal_save_never_became_durable() -> None:
    """SIGUSR2 at step 50, then the attempt is lost (killed) with only checkpoint_started:
    save_margin_negative; it clears once a later attempt saves."""
    log = Log().start(0).pulses(0, 50, list(range(51)))
    log.add(ev.SignalReceived, 50, step=50, signal="SIGUSR2", action="requeue")
    log.add(ev.CheckpointStarted, 50.5, step=50, path="c/sig.ckpt", trigger="signal")
    log.start(200, attempt=1)
    alert = log.alert("save_margin_negative", at=210)
    assert alert.since == pytest.approx(T0 + 200) and "SIGUSR2" in alert.detail
    log.saved(260, 60, attempt=1)
    assert "save_margin_negative" not in log.kinds(at=270)


def test_no_save_margin_alert_when_the_signal_save_was_durable() -> None:
    """A signal save recorded before the attempt ended: the margin held."""
    log = Log().start(0).pulses(0, 50, list(range(51)))
    log.add(ev.SignalReceived, 50, step=50, signal="SIGUSR2", action="requeue")
    log.saved(51, 50, trigger="signal").end(52)
    assert "save_margin_negative" not in log.kinds(at=60)


def test_checkpoint_failures_two_in_a_row_and_a_save_clears_it() -> None:
    """One failure is not an alert; two in a row are; a successful save ends the run of them."""
    log = Log().start(0).saved(5, 5).failed(10, 10)
    assert "checkpoint_failures" not in log.kinds(at=11)
    log.failed(20, 20)
    alert = log.alert("checkpoint_failures", at=21)
    assert "2 failed saves in a row" in alert.detail and "disk full" in alert.detail
    assert alert.since == T0 + 20
    log.failed(25, 25)
    assert log.alert("checkpoint_failures", at=26).since == T0 + 20
    log.saved(30, 30)
    assert "checkpoint_failures" not in log.kinds(at=31)


# --- thresholds ---------------------------------------------------------------------------------


def test_thresholds_validate_and_update_by_name() -> None:
    """Unknown names and bad values raise naming the threshold; known ones convert."""
    th = Thresholds().updated(parse_assignments(["hung_after_s=90", "storm_attempts=4"]))
    assert th.hung_after_s == 90.0 and th.storm_attempts == 4
    with pytest.raises(ThresholdError, match="hung_after"):
        Thresholds().updated({"hung_after": "1"})
    with pytest.raises(ThresholdError, match="storm_attempts"):
        Thresholds(storm_attempts=0)
    with pytest.raises(ThresholdError, match="NAME=VALUE"):
        parse_assignments(["hung_after_s"])


def test_state_keeps_each_ranks_host_last_seen_and_step() -> None:
    """Per attempt, the state lists each rank with its host, last pulse and step; the run's
    progress follows the latest rank-0 pulse."""
    state = two_ranks_training(30).state()
    r0, r1 = state.rank_info(0)
    assert (r1.rank, r1.host, r1.step, r1.last_seen) == (1, "n1", 30, T0 + 30)
    assert r0.host == "n0" and r0.pulses
    assert state.progress is not None and state.progress.step == 30
    assert state.to_dict()["ranks"]["0"][1]["host"] == "n1"
