"""Fixtures shared by the unit tests: a run directory and a wait-until helper."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ckptdash.rundir import RunDir

WaitUntil = Callable[..., None]


@pytest.fixture
def run_dir(tmp_path: Path) -> RunDir:
    """A run directory laid out as the training side creates it (events/, control/, run.json)."""
    rd = RunDir(tmp_path / "run")
    rd.ensure()
    return rd


def _wait_until(condition: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    """Return once ``condition()`` is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()  # never set: wait() is only a short, interruptible pause
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what or condition}")
        pause.wait(0.001)


@pytest.fixture
def wait_until() -> WaitUntil:
    """``wait_until(condition, timeout=10.0, what="")``: poll a condition instead of sleeping."""
    return _wait_until
