"""Ranks started by a launcher agent (torchrun / torch elastic, the deepspeed launcher) notice
when that agent is gone and act on it as on the preemption signal: save, requeue, stop.

``#SBATCH --signal=B:USR2@120`` with ``exec torchrun ...`` delivers SIGUSR2 to the agent
alone. torchrun catches only the signals of its ``--signals-to-handle`` (SIGTERM, SIGINT,
SIGHUP, SIGQUIT by default; the ``TORCHELASTIC_SIGNALS_TO_HANDLE`` variable is overwritten
from that option), so SIGUSR2 ends it at once and its ranks, started in sessions of their
own, are orphaned: they trained on to the end unsaved. A rank's parent changes when its
agent dies (the orphan is adopted by init or a subreaper), so each rank compares
``os.getppid()`` with the agent's pid at every check of the session (a system call, well
under a microsecond); the ranks then agree on the save at that check like on any signal.

Invariant: the agent's exit is recorded once, as a ``signal_received`` named
:data:`AGENT_EXITED`, with the action of the strongest configured signal (``requeue`` by
default): the job cannot go on in place without its agent. Reason: watching the parent
needs no flag, no launcher option and no thread, and works whatever the torch version.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ckptdash.train.config import SignalAction
from ckptdash.train.ending.signals import signal_number

AGENT_EXITED: Final = "launcher-exited"
"""The ``signal`` of the ``signal_received`` a rank records when its launcher agent is gone."""

_STRENGTH: Final = {"ignore": 0, "terminate": 1, "requeue": 2}


@dataclass(frozen=True)
class LauncherAgent:
    """The launcher process this rank was started by."""

    name: str
    """How the start-up line calls it: ``torchrun`` or ``the deepspeed launcher``."""
    pid: int
    """The agent's pid: this rank's parent when it started."""


def detect(environ: Mapping[str, str] | None = None) -> LauncherAgent | None:
    """The launcher agent that started this process, or None (no launcher, or ``srun`` alone).

    torch elastic gives each worker ``TORCHELASTIC_RUN_ID``; the deepspeed launcher is
    recognised by its command line (``deepspeed.launcher.launch``)."""
    env = os.environ if environ is None else environ
    ppid = os.getppid()
    if ppid <= 1:
        return None
    if env.get("TORCHELASTIC_RUN_ID"):
        return LauncherAgent("torchrun", ppid)
    if "deepspeed.launcher.launch" in _cmdline(ppid):
        return LauncherAgent("the deepspeed launcher", ppid)
    return None


def action_on_exit(actions: Mapping[str, SignalAction]) -> SignalAction:
    """What the agent's exit means: the strongest action any configured signal has."""
    return max(actions.values(), key=lambda a: _STRENGTH[a], default="requeue")


class AgentWatch:
    """Tells, once, that the launcher agent this rank started under has exited."""

    def __init__(self, agent: LauncherAgent) -> None:
        self.agent = agent
        self._gone = False

    def exited_now(self) -> bool:
        """True at the first call after the agent exited (this rank's parent changed)."""
        if self._gone or os.getppid() == self.agent.pid:
            return False
        self._gone = True
        return True


def plan(agent: LauncherAgent, actions: Mapping[str, SignalAction]) -> str:
    """The start-up line's part about the agent: which signals it passes on to the ranks and
    what happens when one it does not catch ends it."""
    caught = caught_signals(agent.pid)
    mine = [name for name, action in actions.items() if action != "ignore"]
    if caught is None:
        passes = ""
    else:
        names = [n for n in mine if signal_number(n) in caught]
        missed = [n for n in mine if signal_number(n) not in caught]
        passes = f"passes {'/'.join(names)} to the ranks; " if names else ""
        if missed and agent.name == "torchrun":
            passes += (
                f"{'/'.join(missed)} sent to it alone ends it (to have it passed on: export"
                f" PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,{','.join(missed)}"
                " before torchrun); "
            )
        elif missed:
            passes += f"{'/'.join(missed)} sent to it alone ends it; "
    then = action_on_exit(actions)
    doing = {"requeue": "save, requeue, stop", "terminate": "save, stop", "ignore": "record it"}
    return (
        f"{agent.name} (pid {agent.pid}) {passes}if it exits, the ranks {doing[then]}"
        " at the next check"
    )


def caught_signals(pid: int) -> set[int] | None:
    """The signals process ``pid`` has handlers for (Linux ``/proc/PID/status``), else None."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            mask = int(line.split()[1], 16)
            return {n for n in range(1, signal.NSIG) if mask >> (n - 1) & 1}
    return None


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""
