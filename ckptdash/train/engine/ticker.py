"""A daemon thread that calls a function at a fixed period until stopped.

The Lightning callback uses it to look at the run only about once a period instead of at
every step: Lightning charges each callback hook it dispatches a few µs (a profiler context
per call), more than all of ckptdash's own per-step work, so between checks the callback
keeps its per-step hook switched off and this thread switches it back on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Ticker:
    """Calls ``tick`` every ``period_s`` seconds from its own daemon thread."""

    def __init__(self, period_s: float, tick: Callable[[], None], *, name: str) -> None:
        if period_s <= 0:
            raise ValueError(f"Ticker period_s = {period_s}: must be > 0")
        self.period_s = period_s
        self._tick = tick
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Ticker:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop ticking and wait for the thread (a no-op if it never started)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._tick()
