"""Signal handlers that only record: the work happens at the next step boundary.

A handler that saved a checkpoint would run in the middle of a training step
(Lightning's SLURM handler does exactly that, and the resumed run repeats the
step). Ours appends ``(signal name, time)`` to a list and returns; the session
engine reads the list at a step boundary, where the model is consistent.

Once the attempt has ended, a signal must not change how it ended: SLURM's
``--signal=B:USR2@120`` may land while Lightning tears down after ``run_finished``, and USR2's
default action would end the completed process by signal (SLURM: FAILED). So a signal that
does not ask the process to end (not in :data:`ENDING`) and had no handler before ours is,
from then until the process exits, recorded and otherwise ignored
(:meth:`SignalRecorder.hold_late`); a SIGTERM or SIGINT still gets its old action back.
Python itself puts every handler it installed back to the default action as it shuts down —
after the atexit calls, before it frees the modules (torch and gloo take seconds there under
load) — so from ckptdash's atexit call on, a held signal is ignored instead of recorded.
"""

from __future__ import annotations

import atexit
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any, Final

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

# Handlers from these modules are Lightning's own signal connector and submitit's; we take
# the signal over from them: Lightning's SIGTERM handler would end fit() before our save, its
# SLURM requeue handler saves mid-step and requeues behind ckptdash's back, and submitit's
# requeues and exits inside the handler (no save, the attempt "failed (SystemExit)").
_TAKEN_OVER_MODULES = ("lightning.", "pytorch_lightning.", "lightning_fabric.", "submitit.")
ENDING: Final = frozenset(
    {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, getattr(signal, "SIGQUIT", signal.SIGTERM)}
)
"""Signals that ask the process to end: when the attempt is over their action before ours is
put back (a ``kill`` of a process that goes on after training still ends it)."""
_OWNER_NAMES = {"lightning": "Lightning", "pytorch_lightning": "Lightning", "submitit": "submitit"}


@dataclass(frozen=True, slots=True)
class ReceivedSignal:
    """One delivery: which signal and when (Unix time, taken inside the handler)."""

    name: str
    t: float


def signal_number(name: str) -> int:
    """``"SIGUSR2"``/``"USR2"``/``"12"`` -> the number; ValueError names the value and the fix."""
    text = name.strip().upper()
    if text.isdigit():
        return int(text)
    if not text.startswith("SIG"):
        text = "SIG" + text
    try:
        return int(getattr(signal.Signals, text))
    except AttributeError:
        raise ValueError(
            f"unknown signal {name!r}; use a name such as SIGUSR1, SIGUSR2 or SIGTERM"
        ) from None


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


class SignalRecorder:
    """Installs record-only handlers for some signals and restores the old ones on uninstall.

    Handlers installed before ours are chained (called after we record), except
    Lightning's own connector, which ckptdash replaces while it is installed. On uninstall a
    signal that had no handler and is not in :data:`ENDING` keeps a record-only, ignoring
    one (see the module's docstring). Usable as a context manager.
    """

    def __init__(self, names: list[str] | tuple[str, ...], *, chain: bool = True) -> None:
        self.numbers = [signal_number(n) for n in names]
        self.chain = chain
        self.received: list[ReceivedSignal] = []
        self.on_receive: Callable[[], None] | None = None
        """Called inside the handler after recording (keep it to a flag or an assignment)."""
        self._ignores_at_exit = False
        self._previous: dict[int, Handler] = {}

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    def install(self) -> bool:
        """Install the handlers; returns False (and does nothing) off the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for signum in self.numbers:
            current = signal.getsignal(signum)
            # Our own late holder is no one else's handler: nothing to chain or put back.
            self._previous[signum] = signal.SIG_DFL if current == self._record else current
            signal.signal(signum, self._handle)
        return True

    def uninstall(self) -> None:
        """Put back whatever was installed before (a default action of a signal that does not
        ask the process to end stays held: :meth:`hold_late`)."""
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
        self.hold_late()

    def hold_late(self) -> None:
        """Until the process exits, record and otherwise ignore each of this recorder's signals
        that is not in :data:`ENDING` and has its default action now (off the main thread:
        nothing). A framework that restores the handlers it found restores this one."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self.numbers:
            if signum not in ENDING and signal.getsignal(signum) in (signal.SIG_DFL, None):
                signal.signal(signum, self._record)
                if not self._ignores_at_exit:
                    atexit.register(self._ignore_held_at_exit)
                    self._ignores_at_exit = True

    def _ignore_held_at_exit(self) -> None:
        """At interpreter exit, each signal still held by this recorder is ignored: Python's
        shutdown resets its handlers to the default action, and a USR2 landing while torch is
        freed would end a completed job by signal (SLURM: FAILED)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self.numbers:
            if signal.getsignal(signum) == self._record:
                signal.signal(signum, signal.SIG_IGN)

    def add(self, name: str) -> None:
        """Handle ``name`` too (before :meth:`install`)."""
        signum = signal_number(name)
        if signum not in self.numbers:
            self.numbers.append(signum)

    def previous_owner(self, signum: int) -> tuple[str, bool] | None:
        """Who handled ``signum`` before us, and whether we still call it; None if nobody."""
        previous = self._previous.get(signum)
        if not callable(previous):
            return None
        taken_over = _is_taken_over(previous)
        return _owner_name(previous), self.chain and not taken_over

    def take(self) -> list[ReceivedSignal]:
        """Everything received since the last call (safe against a signal arriving meanwhile)."""
        if not self.received:
            return []
        taken = self.received[:]
        del self.received[: len(taken)]
        return taken

    def _record(self, signum: int, frame: FrameType | None) -> None:
        # Record and return: list.append is atomic under the GIL.
        self.received.append(ReceivedSignal(signal_name(signum), time.time()))

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._record(signum, frame)
        if self.on_receive is not None:
            self.on_receive()
        previous = self._previous.get(signum)
        if self.chain and callable(previous) and not _is_taken_over(previous):
            previous(signum, frame)

    def __enter__(self) -> SignalRecorder:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()


def _is_taken_over(handler: Callable[..., Any]) -> bool:
    module = getattr(handler, "__module__", "") or ""
    owner = getattr(getattr(handler, "__self__", None), "__class__", None)
    owner_module = getattr(owner, "__module__", "") or ""
    return any(m.startswith(_TAKEN_OVER_MODULES) for m in (module + ".", owner_module + "."))


def _owner_name(handler: Callable[..., Any]) -> str:
    bound_to = getattr(handler, "__self__", None)  # a bound method: its class's module
    module = getattr(handler if bound_to is None else type(bound_to), "__module__", "") or ""
    if module.startswith("lightning_fabric."):
        return "Lightning"
    return _OWNER_NAMES.get(module.split(".")[0], module or repr(handler))
