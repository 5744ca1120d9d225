"""What a session takes in at a check as "a signal came": the record-only handlers' deliveries
and the launcher agent's exit, each with the action it stands for.

Invariant: every name in :attr:`SignalIntake.actions` is spelt ``SIGNAME`` and has a
record-only handler once installed; the scheduler's meanings (Grid Engine's USR1) sit under the
user's ``TrainConfig.signals``, never a default action; a launcher agent gone
(:mod:`ckptdash.train.ending.agent`) is taken once, with the strongest configured action.
Reason: the session, its start-up line and the late-requeue wait read one map, and the agent's
exit reaches the agreement the same way as a signal, so nothing downstream tells them apart.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from ckptdash.train.config import SignalAction
from ckptdash.train.ending import agent
from ckptdash.train.ending.signals import SignalRecorder
from ckptdash.train.engine.decision import ACTION_CODE, REQUEUE


@dataclass(frozen=True, slots=True)
class Taken:
    """One thing that came in since the last check: what to record and act on."""

    name: str
    """``SIGUSR2``, or :data:`~ckptdash.train.ending.agent.AGENT_EXITED`."""
    action: SignalAction
    t: float
    """Unix time it happened (a signal: inside its handler; the agent: when noticed)."""


def signal_key(name: str) -> str:
    """``"usr2"``/``"SIGUSR2"`` -> ``"SIGUSR2"``: how :attr:`SignalIntake.actions` spells it."""
    return "SIG" + name.upper().removeprefix("SIG")


class SignalIntake:
    """The signals one process acts on and the launcher agent it watches."""

    def __init__(
        self, scheduler_signals: Mapping[str, SignalAction], signals: Mapping[str, SignalAction]
    ) -> None:
        wanted = {**scheduler_signals, **signals}.items()
        self.actions: dict[str, SignalAction] = {signal_key(n): a for n, a in wanted}
        """Each handled signal's action, in the order the start-up line names them."""
        self.recorder = SignalRecorder(list(self.actions))
        launcher = agent.detect()
        self.agent_watch = agent.AgentWatch(launcher) if launcher is not None else None
        """Notices this process's launcher agent (torchrun) exiting, if it has one."""

    def add(self, name: str, action: SignalAction) -> None:
        """Handle signal ``name`` with ``action`` too, unless it is handled already."""
        key = signal_key(name)
        if key not in self.actions:
            self.actions[key] = action
            self.recorder.add(key)

    @property
    def may_requeue(self) -> bool:
        """Whether any handled signal asks for a requeue."""
        return any(ACTION_CODE[a] >= REQUEUE for a in self.actions.values())

    def agent_plan(self) -> str:
        """The start-up line's part about the launcher agent (``"; torchrun ..."``), or ``""``."""
        if self.agent_watch is None:
            return ""
        return "; " + agent.plan(self.agent_watch.agent, self.actions)

    def take(self) -> list[Taken]:
        """What came in since the last call, oldest first."""
        out = [
            Taken(got.name, self.actions.get(got.name, "ignore"), got.t)
            for got in self.recorder.take()
        ]
        if self.agent_watch is not None and self.agent_watch.exited_now():
            out.append(Taken(agent.AGENT_EXITED, agent.action_on_exit(self.actions), time.time()))
        return out
