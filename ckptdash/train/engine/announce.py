"""The one line a training process prints at start: what each signal will do."""

from __future__ import annotations

import signal
import sys
from collections.abc import Mapping
from typing import TextIO

from ckptdash.schedulers.base import Scheduler
from ckptdash.train.config import SignalAction, TrainConfig
from ckptdash.train.ending import requeue
from ckptdash.train.ending.signals import SignalRecorder, signal_number


def announce_stream() -> TextIO:
    """Where the line goes: stderr, beside the framework's own start-up lines in a terminal
    or a job's log; stdout in a Jupyter kernel, where stderr is drawn red, as a warning."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    shell = get() if get is not None else None
    return sys.stdout if getattr(shell, "kernel", None) is not None else sys.stderr


def announcement(
    actions: Mapping[str, SignalAction],
    config: TrainConfig,
    scheduler: Scheduler,
    signals: SignalRecorder,
) -> str:
    """``ckptdash: SIGUSR1 -> ...; SIGTERM -> ...`` for the signals in ``actions``."""
    plans = [
        f"{name} -> {_signal_plan(name, action, config, scheduler, signals)}"
        for name, action in actions.items()
    ]
    if (
        scheduler.name == "slurm"
        and "SIGUSR1" not in actions
        and signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None)
    ):
        # SLURM's usual --signal=USR1 (Lightning's default) with nobody to catch it,
        # e.g. Lightning not detecting SLURM without --ntasks: the process just dies.
        plans.append(
            "SIGUSR1 -> nobody handles it: it ends the process unsaved (send USR2, or map"
            " it: TrainConfig(signals={'SIGUSR1': 'requeue', 'SIGTERM': 'terminate'}))"
        )
    return "ckptdash: " + "; ".join(plans)


def _signal_plan(
    name: str,
    action: SignalAction,
    config: TrainConfig,
    scheduler: Scheduler,
    signals: SignalRecorder,
) -> str:
    if action == "ignore":
        plan = "record only"
    else:
        plan = "save at the next step boundary"
        if action == "requeue":
            plan += ", requeue " + requeue.plan(config, scheduler)
        if config.exit_on_signal:
            plan += ", stop"
    owner = signals.previous_owner(signal_number(name))
    if owner is not None:
        who, chained = owner
        plan += f" (then {who}'s handler runs)" if chained else f" (replaces {who}'s handler)"
    return plan
