"""`ckptdash demo` in a real browser (Debian's chromium, driven by Playwright): the dashboard
it serves shows the preemption, the signal save, the requeue and the resume as they happen,
and Ctrl-C ends the demo cleanly with nothing left running.

Without chromium this test skips, saying how to install it; in CI (CI=true) it fails.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ckptdash._dev.testing import launch_chromium, require_chromium
from ckptdash.state.reading import load_state
from tests.processes import descendants

pytestmark = pytest.mark.ui

require_chromium()

from playwright.sync_api import expect, sync_playwright  # noqa: E402


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_for_url(log: Path, proc: subprocess.Popen[bytes], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    pause = threading.Event()  # never set: a short pause between looks at the log
    while time.monotonic() < deadline:
        found = re.search(r"live dashboard at (http://\S+)", log.read_text())
        if found:
            return found.group(1)
        if proc.poll() is not None:
            break
        pause.wait(0.05)
    raise AssertionError(f"the demo printed no dashboard URL:\n{log.read_text()}")


def test_demo_dashboard_shows_preemption_then_ctrl_c_ends_everything(
    tmp_path: Path, wait_until: Callable[..., None]
) -> None:
    """While `ckptdash demo` trains, its dashboard shows the signal checkpoint and attempt 1
    resuming from it; Ctrl-C (SIGINT to the whole process group, as a terminal sends it)
    ends the demo with status 0 and a goodbye, no traceback, and no process of it left
    running."""
    run = tmp_path / "demo"
    log = tmp_path / "demo.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ckptdash",
                "demo",
                "--run-dir",
                str(run),
                "--steps",
                "300",
                "--preempt-every",
                "1",
                "--max-preemptions",
                "1",
                "--kills",
                "0",
                "--port",
                "0",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tempfile.gettempdir(),
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
            start_new_session=True,  # its own process group: Ctrl-C goes to all of it
        )
    try:
        url = _wait_for_url(log, proc, timeout=60)
        with sync_playwright() as p:
            browser = launch_chromium(p)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(url)
                signal_row = page.locator(".tabulator-row", has_text="signal.ckpt")
                expect(signal_row.first).to_be_visible(timeout=90_000)
                expect(page.get_by_text("attempt 1 is training")).to_be_visible(timeout=60_000)
                expect(page.get_by_text("(2 of").first).to_be_visible()
            finally:
                browser.close()
        assert proc.poll() is None, "the demo ended before Ctrl-C:\n" + log.read_text()
        started = descendants(proc.pid)
        assert started, "no training attempt was running at Ctrl-C"
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=90) == 0, log.read_text()
        wait_until(lambda: not any(map(_running, started)), timeout=30, what="the demo's processes")
    finally:
        for pid in descendants(proc.pid) if proc.poll() is None else ():
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = log.read_text()
    assert "stopped by Ctrl-C, goodbye" in output
    assert "Traceback" not in output
    state = load_state(run)
    resumed = state.attempts[1].resumed_from
    assert resumed is not None
    signal_steps = {c.step for c in state.checkpoints.values() if c.trigger == "signal"}
    assert state.checkpoints[resumed].step in signal_steps  # a periodic save may share it
    assert state.attempts[1].outcome != "running", "attempt 1 ended without recording it"
