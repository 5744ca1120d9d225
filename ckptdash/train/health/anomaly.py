"""Anomalies: a watched metric (the loss) that goes non-finite or spikes, seen at heartbeats.

The check runs on rank 0 when a heartbeat is written (every ``heartbeat_interval_s``),
with the metrics the heartbeat carries, so training pays nothing for it per step. What
happens next is :attr:`TrainConfig.on_anomaly`:

* ``record``: an ``anomaly`` event, training goes on;
* ``stop``: the event, then every rank stops at this step boundary without saving (the
  model has diverged: a save now would become the newest checkpoint) and without requeue;
* ``rollback``: as ``stop``, but first the newest valid checkpoint at or before the last
  healthy heartbeat is pinned as the resume checkpoint, and the job requeues as the policy
  allows; the next attempt resumes before the divergence and clears that pin once used.

One event per excursion: after an anomaly nothing more is recorded until a healthy value.
"""

from __future__ import annotations

import math
import os
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from ckptdash import control
from ckptdash.events import AnomalyDetected
from ckptdash.resume import ValidateMode, check_checkpoint
from ckptdash.rundir import RunDir
from ckptdash.rundir.writer import EventWriter
from ckptdash.state.reading import load_state
from ckptdash.state.records import CheckpointInfo

AnomalyAction = Literal["record", "stop", "rollback"]
ANOMALY_ACTIONS: Final[tuple[str, ...]] = ("record", "stop", "rollback")
ROLLBACK_AUTHOR: Final = "ckptdash rollback"
"""``updated_by`` of a pin that a rollback wrote (the resume that uses it clears it)."""
MIN_HISTORY: Final = 3
"""Healthy values needed before a spike can be judged against their median."""


@dataclass(frozen=True)
class Anomaly:
    """What went bad: the step, the metric, its value (None when not finite) and why."""

    step: int
    metric: str
    value: float | None
    reason: str
    healthy_step: int | None
    """The step of the last healthy value: the divergence started after it."""


class AnomalyWatch:
    """Judges each heartbeat's value of ``metric``; see the module docstring."""

    def __init__(self, metric: str, factor: float, window: int) -> None:
        self.metric = metric
        self.factor = factor
        self._recent: deque[float] = deque(maxlen=window)
        self._in_excursion = False
        self.healthy_step: int | None = None

    def check(self, step: int, metrics: Mapping[str, float]) -> Anomaly | None:
        """An :class:`Anomaly` when ``metrics[metric]`` starts an excursion, else None."""
        value = metrics.get(self.metric)
        if value is None:
            return None
        reason = ""
        if not math.isfinite(value):
            reason = f"{self.metric} is {value} (not finite)"
        elif len(self._recent) >= MIN_HISTORY:
            median = statistics.median(self._recent)
            if median > 0 and value > self.factor * median:
                reason = (
                    f"{self.metric} {value:.4g} > {self.factor:g} × the median {median:.4g}"
                    f" of its last {len(self._recent)} values"
                )
        if not reason:
            self._recent.append(value)
            self._in_excursion = False
            self.healthy_step = step
            return None
        if self._in_excursion:
            return None
        self._in_excursion = True
        shown = value if math.isfinite(value) else None
        return Anomaly(step, self.metric, shown, reason, self.healthy_step)


def rollback_target(
    run: RunDir, anomaly: Anomaly, validate: ValidateMode = "size"
) -> CheckpointInfo | None:
    """The newest valid checkpoint at or before the last healthy step (None: nothing safe)."""
    if anomaly.healthy_step is None:
        return None
    state = load_state(run)
    for info in reversed(state.valid_checkpoints()):
        step = info.step
        if (
            step is not None
            and step <= anomaly.healthy_step
            and check_checkpoint(info, validate) is None
        ):
            return info
    return None


def pin_for_rollback(run: RunDir, path: str, step: int) -> None:
    """Pin ``path`` for the next attempt, signed so that its resume clears the pin."""
    control.update_settings(run, resume_pin=path, author=f"{ROLLBACK_AUTHOR} at step {step}")


def consume_pin(run: RunDir, loaded: str) -> str:
    """After a resume from the pinned checkpoint, remove the pin unless it is sticky: a pin is
    for the attempt that loads it (a rollback's too), so a later preemption resumes from what
    was trained since. Returns what ``run_resumed`` says about the pin ("" when ``loaded`` is
    not the pin)."""
    try:
        settings = control.read_settings(run)
        pin = settings.resume_pin
        if pin is None or os.path.abspath(pin) != os.path.abspath(loaded):
            return ""
        rollback = settings.updated_by.startswith(ROLLBACK_AUTHOR)
        if settings.resume_pin_sticky and not rollback:
            return "; sticky pin kept (`ckptdash resume RUN --clear` removes it)"
        author = ROLLBACK_AUTHOR + " (used)" if rollback else None
        control.update_settings(run, resume_pin=None, author=author)
    except Exception as exc:  # the pin is a convenience: never fail a resume over it
        return f"; the pin could not be cleared ({exc}): it stays for the next attempt"
    return "; pin consumed (`ckptdash resume RUN --pin PATH --sticky` keeps a pin)"


def respond(run: RunDir, writer: EventWriter, found: Anomaly, action: AnomalyAction) -> int:
    """Record ``found`` and act as ``action`` says (rank 0). Returns what the ranks must
    agree on: 0 go on, 1 stop, 2 roll back (stop and requeue to the pinned checkpoint)."""
    reason, pinned = found.reason, None
    if action == "rollback":
        try:
            target = rollback_target(run, found)
            if target is not None:
                pin_for_rollback(run, target.path, found.step)
                pinned = target.path
        except Exception as exc:  # no pin: stop without requeue rather than resume diverged
            reason += f"; could not pin a checkpoint: {exc}"
        if pinned is None and "could not pin" not in reason:
            reason += "; no valid checkpoint before it to roll back to: stopping only"
    writer.emit(
        AnomalyDetected,
        step=found.step,
        metric=found.metric,
        value=found.value,
        reason=reason,
        action=action,
        pinned=pinned,
    )
    if action == "record":
        return 0
    return 2 if pinned is not None else 1


def numeric(metrics: Mapping[str, Any] | None) -> dict[str, float]:
    """The metrics that are numbers, as floats (what a heartbeat records; others are left out)."""
    out: dict[str, float] = {}
    for name, value in (metrics or {}).items():
        try:
            out[str(name)] = float(value)
        except (TypeError, ValueError):
            continue
    return out
