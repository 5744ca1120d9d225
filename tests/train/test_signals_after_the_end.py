"""After an attempt ended, a signal that does not ask the process to end is recorded and
ignored until the process exits, so a completed job is not ended by USR2's default action
(issue 32, point 8); SIGTERM gets its old action back. The real job's exit status under SLURM:
tests/slurm/test_late_signal.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptdash.train.ending.signals import SignalRecorder


@pytest.fixture
def dispositions() -> Iterator[None]:
    """USR2 and TERM at their default actions for the test, and put back after it."""
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM)}
    for s in before:
        signal.signal(s, signal.SIG_DFL)
    yield
    for s, handler in before.items():
        signal.signal(s, handler if handler is not None else signal.SIG_DFL)


@pytest.mark.usefixtures("dispositions")
def test_a_usr2_after_the_handlers_are_released_is_recorded_not_fatal() -> None:
    """Uninstalling the recorder leaves USR2 held (not its default action, which would end
    the process) and SIGTERM at its default; a USR2 then is recorded and the process lives."""
    recorder = SignalRecorder(["SIGUSR2", "SIGTERM"])
    assert recorder.install()
    recorder.uninstall()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    held = signal.getsignal(signal.SIGUSR2)
    # Checked before raising: a regression fails here instead of killing the test runner.
    assert held not in (signal.SIG_DFL, signal.SIG_IGN, None)
    signal.raise_signal(signal.SIGUSR2)
    assert [r.name for r in recorder.take()] == ["SIGUSR2"]


@pytest.mark.usefixtures("dispositions")
def test_a_held_signal_is_no_handler_to_chain_when_the_next_attempt_installs() -> None:
    """Held before install (the Lightning callback holds at setup, before fit() captures the
    handlers it restores): the recorder takes over as from a default action — one record per
    delivery, and no "chained" previous owner announced."""
    recorder = SignalRecorder(["SIGUSR2"])
    recorder.hold_late()
    assert recorder.install()
    assert recorder.previous_owner(signal.SIGUSR2) is None
    signal.raise_signal(signal.SIGUSR2)
    assert [r.name for r in recorder.take()] == ["SIGUSR2"]
    recorder.uninstall()


# A finished attempt's process as Python shuts it down: the object's finalizer runs in the
# interpreter's last garbage collection, after atexit and after Python has reset its signal
# handlers, where a real job frees torch and gloo (seconds under load) while SLURM's warning
# signal may still land.
_SHUTDOWN_CHILD = """\
import gc, os, signal
from ckptdash.train.ending.signals import SignalRecorder

recorder = SignalRecorder(["SIGUSR2"])
recorder.install()
recorder.uninstall()

class LandsDuringShutdown:
    def __del__(self):
        os.write(2, b"USR2 sent during shutdown\\n")
        os.kill(os.getpid(), signal.SIGUSR2)

gc.disable()  # only the interpreter's last collection finds the cycle
late = LandsDuringShutdown()
late.cycle = late
del late
"""


def test_a_usr2_while_python_shuts_down_does_not_end_the_process_by_signal() -> None:
    """A held USR2 that lands after the atexit calls, as the interpreter frees its modules,
    leaves the exit status 0 (before, Python's shutdown had put USR2's default action back and
    the completed job ended by signal 12: SLURM's FAILED, seen in the time-limit scenario)."""
    root = Path(__file__).resolve().parents[2]
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SHUTDOWN_CHILD)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "USR2 sent during shutdown" in child.stderr, child.stderr  # the signal did land
    assert child.returncode == 0, child.stderr
