"""Signals to a launcher process, passed on to the workers it started.

Lightning's ``ddp_spawn`` (and any launcher built on ``multiprocessing``)
trains in child processes while the launcher waits for them. SLURM's
``--signal=B:USR2@90`` with ``exec python train.py`` reaches the launcher only:
its default action kills it, and the workers die with it (they are started
with a parent-death signal) — nothing saved, nothing recorded. The
:class:`ChildForwarder` installed in the launcher sends each signal on to the
live ``multiprocessing`` children, whose ckptdash records it and saves at the
next step boundary like any other signal. With no child alive the launcher
behaves as if the forwarder were not there.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from types import FrameType

from ckptdash.train.ending.signals import Handler, signal_number

_installed: ChildForwarder | None = None


class ChildForwarder:
    """Forwards ``signals`` to this process's live multiprocessing children."""

    def __init__(self, names: list[str]) -> None:
        self.numbers = [signal_number(n) for n in names]
        self.forwarded: list[tuple[int, int]] = []
        """(signal number, child pid) for every forward, for tests and post-mortems."""
        self._previous: dict[int, Handler] = {}

    def install(self) -> bool:
        """Install on the main thread (returns False elsewhere, doing nothing)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for signum in self.numbers:
            if signal.getsignal(signum) != self._handle:
                self._previous[signum] = signal.getsignal(signum)
                signal.signal(signum, self._handle)
        return True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        children = [p.pid for p in multiprocessing.active_children() if p.pid is not None]
        for pid in children:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                continue  # it ended meanwhile
            self.forwarded.append((signum, pid))
        if children:
            return
        # No worker to pass it to: do what would have happened without us.
        previous = self._previous.get(signum, signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)


def forward_to_children(names: list[str]) -> ChildForwarder | None:
    """Install (once per process) a forwarder of ``names`` to the workers this process starts."""
    global _installed
    if _installed is None:
        forwarder = ChildForwarder(names)
        if not forwarder.install():
            return None
        _installed = forwarder
    return _installed
