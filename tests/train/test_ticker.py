"""The ticker that times the Lightning callback's checks."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from ckptdash.train.engine.ticker import Ticker


def test_ticks_at_its_period_until_stopped() -> None:
    ticks: list[float] = []
    ticker = Ticker(0.05, lambda: ticks.append(time.monotonic()), name="test-ticker").start()
    deadline = time.monotonic() + 10
    while len(ticks) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)  # the ticker's own thread appends; nothing else to wait on
    ticker.stop()
    count = len(ticks)
    assert count >= 3
    assert all(b - a >= 0.04 for a, b in itertools.pairwise(ticks))
    time.sleep(0.15)
    assert len(ticks) == count  # stopped means no more ticks
    assert not any(t.name == "test-ticker" for t in threading.enumerate())


def test_a_period_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="period_s = 0"):
        Ticker(0, lambda: None, name="never")
