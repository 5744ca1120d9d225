"""What the ranks agree on at a check: the requests gathered since the last one, and the
:class:`Decision` they add up to.

Every rank fills a :class:`Pending` between checks (signals it received; rank 0 also
commands and anomalies), the check reduces the five numbers of :meth:`Pending.codes`
with MAX across ranks, and :func:`decide` turns the agreed numbers into one decision,
the same on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from ckptdash import control
from ckptdash.events import Trigger

# Codes carried by the agreement collective (MAX wins across ranks).
NO_SIGNAL, TERMINATE, REQUEUE = 0, 1, 2
ACTION_CODE: Final = {"ignore": NO_SIGNAL, "terminate": TERMINATE, "requeue": REQUEUE}


@dataclass(frozen=True, slots=True)
class Decision:
    """What every rank does at this step boundary: save (with the trigger), then maybe stop."""

    trigger: Trigger
    stop: bool
    requeue: bool
    reason: str
    save: bool = True
    """False after an anomaly: the model diverged, and a save would become the newest
    checkpoint; then only stop (and requeue) as decided."""


@dataclass
class Pending:
    """Requests gathered between checks, consumed by the next agreement."""

    signal_code: int = NO_SIGNAL
    manual: bool = False
    stop: bool = False
    anomaly: int = 0  # 1: stop, 2: roll back (stop and requeue)
    commands: list[control.Claimed] = field(default_factory=list)


def decide(
    signal_code: int, manual: int, stop: int, bad: int, *, exit_on_signal: bool
) -> Decision | None:
    """The decision the agreed codes add up to, or None when nothing is due."""
    if bad:  # before a signal's save: saving a diverged model would make it the newest
        return Decision(
            trigger="exception", stop=True, requeue=bad == 2, reason="anomaly", save=False
        )
    if signal_code != NO_SIGNAL:
        requeue = signal_code == REQUEUE
        return Decision(
            trigger="signal",
            stop=exit_on_signal,
            requeue=requeue,
            reason="preempted" if requeue else "terminated",
        )
    if manual or stop:
        return Decision(
            trigger="manual", stop=bool(stop), requeue=False, reason="stopped by command"
        )
    return None
