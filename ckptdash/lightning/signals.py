"""Taking the signals over from Lightning: ckptdash's handlers first, Lightning's SLURM
auto-requeue signal turned into one of ckptdash's."""

from __future__ import annotations

from typing import Any

from ckptdash.lightning import compat
from ckptdash.train.ending.signals import signal_name
from ckptdash.train.engine.session import Session


def take_signals_over(trainer: Any, session: Session) -> None:
    """Install ckptdash's handlers (once) after Lightning registered its own."""
    if session.signals.installed:
        return  # since the sanity check
    # Installed after Lightning registered its own handlers, so ours run first and
    # Lightning's SIGTERM handler cannot end fit() before the signal save.
    requeue_signal = lightning_requeue_signal(trainer)
    if requeue_signal is not None:
        # Lightning's SLURM auto-requeue is on: its handler would save hpc_ckpt_N mid-step
        # and requeue behind ckptdash's back. Its signal becomes one of ours instead: the
        # same save at the step boundary, ckptdash's requeue and budget.
        session.also_handle(requeue_signal, "requeue")
    session.signals.install()
    session.announce_signals()


def lightning_requeue_signal(trainer: Any) -> str | None:
    """The signal of Lightning's SLURM auto-requeue when it is on (SLURM detected), else None."""
    env = compat.cluster_environment(trainer)
    if type(env).__name__ != "SLURMEnvironment" or not getattr(env, "auto_requeue", False):
        return None
    signum = getattr(env, "requeue_signal", None)
    return None if signum is None else signal_name(int(signum))
