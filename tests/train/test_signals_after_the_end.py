"""After an attempt ended, a signal that does not ask the process to end is recorded and
ignored until the process exits, so a completed job is not ended by USR2's default action
(issue 32, point 8); SIGTERM gets its old action back. The real job's exit status under SLURM:
tests/slurm/test_late_signal.py."""

from __future__ import annotations

import signal
from collections.abc import Iterator

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
