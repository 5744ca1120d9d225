"""When a step boundary does more than count: the cadence of checks, polls and heartbeats.

A check (take the signals, claim commands, agree across ranks) costs a collective, so it runs
every ``check_every`` steps, a count retuned from the measured step time so that an agreement
happens about every ``agree_interval_s`` whatever the step time. Two boundaries always check:
the last step's and the one after it, when the loop's length is known, so that a signal in the
last step is acted on by every rank instead of ending training unseen between two agreements.
Rank 0 polls the inbox and writes heartbeats at their own, time-based intervals within checks.
"""

from __future__ import annotations

import sys
from typing import Final

MAX_CHECK_EVERY: Final = 10_000
"""The most steps between two checks (very fast steps)."""


class Cadence:
    """The countdown to the next check, and the times the next poll and heartbeat are due."""

    def __init__(self, agree_interval_s: float, poll_interval_s: float, heartbeat_s: float) -> None:
        self.agree_interval_s = agree_interval_s
        self.poll_interval_s = poll_interval_s
        self.heartbeat_s = heartbeat_s
        self.check_every = 1
        """Steps between checks; every rank uses the largest any rank asked for (agreed)."""
        self._countdown = 1
        self._last_step: int | None = None
        self._last_time = 0.0
        self._next_poll = 0.0
        self._next_heartbeat = 0.0
        self._always_from = sys.maxsize

    def start(self, now: float, max_steps: int | None) -> None:
        """The attempt starts at ``now``; ``max_steps``, when known, makes its last step check."""
        self._last_time = now
        if max_steps:
            # max_steps - 1: a loop's last step index; Lightning counts max_steps after it.
            self._always_from = max_steps - 1

    def due(self, step: int) -> bool:
        """Count this boundary down; True where a check is due (the hot path: a few compares)."""
        self._countdown -= 1
        return self._countdown <= 0 or self._always_from <= step <= self._always_from + 1

    def check_in(self, boundaries: int) -> None:
        """Make the next check due ``boundaries`` boundaries from now (benchmarks pin it)."""
        self._countdown = boundaries

    def retune(self, step: int, now: float) -> None:
        """Derive the steps between checks from the step time measured since the last check."""
        if self._last_step is not None and step > self._last_step:
            step_time = (now - self._last_time) / (step - self._last_step)
            target = self.agree_interval_s / max(step_time, 1e-6)
            self.check_every = int(min(max(target, 1), MAX_CHECK_EVERY))
        self._last_step = step
        self._last_time = now

    def agreed(self, check_every: int) -> None:
        """Every rank's largest ``check_every``: the countdown restarts from it."""
        self.check_every = max(1, check_every)
        self._countdown = self.check_every

    def poll_due(self, now: float) -> bool:
        """True (and the next poll scheduled) when rank 0 should look at the inbox."""
        if now < self._next_poll:
            return False
        self._next_poll = now + self.poll_interval_s
        return True

    def heartbeat_due(self, now: float) -> bool:
        """True (and the next heartbeat scheduled) when rank 0 should write a heartbeat."""
        if now < self._next_heartbeat:
            return False
        self._next_heartbeat = now + self.heartbeat_s
        return True
