"""The dashboard in a real browser (Debian's chromium, driven by Playwright) against a real
`ckptdash serve` process, while a writer keeps appending events to the run.

Without chromium these tests skip, saying how to install it; in CI (CI=true) they fail.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from ckptdash import control, events
from ckptdash._dev.testing import FakeTrainer, ServeProcess, launch_chromium, require_chromium

pytestmark = pytest.mark.ui
WaitUntil = Callable[..., None]
LOCAL_HOSTS = {"127.0.0.1", "localhost"}

require_chromium()

from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402


class Heartbeats:
    """Appends a heartbeat every 100 ms from its own thread, as a training job does."""

    def __init__(self, trainer: FakeTrainer) -> None:
        self._trainer = trainer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-heartbeats")

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self._trainer.writer.emit(events.Heartbeat, step=self._trainer.step, epoch=0)

    def __enter__(self) -> Heartbeats:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, FakeTrainer]]:
    """A run being written: started, three periodic saves, a heartbeat every 100 ms."""
    root = tmp_path_factory.mktemp("ui") / "live-run"
    with FakeTrainer(root) as trainer:
        trainer.start(max_steps=1000, job_id="4242")
        for step in (1, 2, 3):
            trainer.save(step)
        with Heartbeats(trainer):
            yield root, trainer


@pytest.fixture(scope="module")
def server(live: tuple[Path, FakeTrainer]) -> Iterator[str]:
    """`ckptdash serve RUN_DIR --port 0` as a user starts it; yields the URL it prints."""
    root, _ = live
    with ServeProcess(root) as proc:
        yield proc.url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless chromium for the module."""
    with sync_playwright() as p:
        b = launch_chromium(p)
        yield b
        b.close()


class Tab:
    """The dashboard open in one tab for the whole module (a page load costs seconds), with
    every request that left this machine."""

    def __init__(self, browser: Any, url: str) -> None:
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.page = self.context.new_page()
        self.external: list[str] = []
        self.page.on("request", lambda r: self.external.append(r.url) if _external(r.url) else None)
        self.page.goto(url)
        expect(self.page.get_by_role("button", name="Save now")).to_be_enabled(timeout=90_000)


@pytest.fixture(scope="module")
def tab(browser: Any, server: str) -> Iterator[Tab]:
    tab = Tab(browser, server)
    yield tab
    tab.context.close()


@pytest.fixture
def page(tab: Tab) -> Iterator[Page]:
    """The dashboard's tab; the test fails if the page asked any other host for anything
    (it must work on an offline login node)."""
    yield tab.page
    assert tab.external == [], f"the page fetched from other hosts: {tab.external[:5]}"


def _external(url: str) -> bool:
    """A request that leaves this machine (data: and blob: URLs never do)."""
    parts = urlparse(url)
    return parts.scheme in ("http", "https", "ws", "wss") and parts.hostname not in LOCAL_HOSTS


def _inbox(root: Path) -> list[Path]:
    return sorted((root / "control" / "inbox").glob("*.json"))


def test_page_shows_the_run_and_its_checkpoints(page: Page) -> None:
    """The page names the run, its state and its checkpoints, all from this server."""
    expect(page.locator(".tabulator-row", has_text="step=3-periodic.ckpt")).to_be_visible()
    expect(page.get_by_text("running").first).to_be_visible()


def test_a_new_checkpoint_shows_live(page: Page, live: tuple[Path, FakeTrainer]) -> None:
    """A checkpoint_saved appended to the log appears on the open page without a reload.

    How fast (the issue's bar: within a second) is measured, not asserted here, by
    benchmarks/dash_latency.py: p95 134 ms on a quiet 2-core machine.
    """
    _, trainer = live
    step = trainer.step + 10
    trainer.save(step)
    row = page.locator(".tabulator-row", has_text=f"step={step}-periodic.ckpt")
    expect(row).to_be_visible(timeout=10_000)


def test_save_now_makes_one_command_then_shows_it_applied_with_the_path(
    page: Page, live: tuple[Path, FakeTrainer], wait_until: WaitUntil
) -> None:
    """One click is exactly one command, shown pending; when the trainer applies it the page
    shows it applied with the checkpoint's path."""
    root, trainer = live
    assert _inbox(root) == []
    page.get_by_role("button", name="Save now").click()
    expect(page.locator("td", has_text="pending").first).to_be_visible(timeout=5000)
    assert len(_inbox(root)) == 1
    (answered,) = trainer.answer()
    path = f"step={trainer.step}-manual.ckpt"
    commands = page.locator("td", has_text="applied")
    expect(commands.first).to_be_visible(timeout=5000)
    expect(page.locator("code", has_text=path).first).to_be_visible()
    assert answered in "".join(p.name for p in (root / "control" / "done").iterdir())


def test_suspend_requeue_flips_the_settings_file(
    page: Page, live: tuple[Path, FakeTrainer], wait_until: WaitUntil
) -> None:
    """Suspend writes requeue_suspended=true; the button then offers to resume, which writes
    false."""
    root, _ = live
    page.get_by_role("button", name="Suspend auto-requeue").click()
    wait_until(lambda: control.read_settings(root).requeue_suspended, what="the setting")
    resume = page.get_by_role("button", name="Allow auto-requeue")
    expect(resume).to_be_visible(timeout=5000)
    resume.click()
    wait_until(lambda: not control.read_settings(root).requeue_suspended, what="the setting")
    expect(page.get_by_role("button", name="Suspend auto-requeue")).to_be_visible(timeout=5000)


def test_pinning_a_row_changes_what_ckptdash_resume_prints(
    page: Page, live: tuple[Path, FakeTrainer], wait_until: WaitUntil
) -> None:
    """Select an older checkpoint, click "Resume from this": `ckptdash resume RUN_DIR` now
    names it; "Clear resume pin" goes back to the rule."""
    root, _ = live
    older = str(root / "checkpoints" / "step=2-periodic.ckpt")
    page.locator(".tabulator-row", has_text="step=2-periodic.ckpt").click()
    page.get_by_role("button", name="Resume from this").click()
    wait_until(lambda: control.read_settings(root).resume_pin == older, what="the pin")
    out = subprocess.run(
        [sys.executable, "-m", "ckptdash", "resume", str(root)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"resumes from: {older}" in out
    assert "pinned" in out
    page.get_by_role("button", name="Clear resume pin").click()
    wait_until(lambda: control.read_settings(root).resume_pin is None, what="the pin cleared")


def test_stop_needs_confirmation_and_a_rejection_shows_its_reason(
    page: Page, live: tuple[Path, FakeTrainer], wait_until: WaitUntil
) -> None:
    """Stop after save writes nothing until confirmed, then one command; a rejection from the
    job shows with its reason, also on the line under the buttons."""
    root, trainer = live
    page.get_by_role("button", name="Stop after save…").click()
    expect(page.get_by_text("Stop the job?")).to_be_visible()
    assert _inbox(root) == []
    page.get_by_role("button", name="Confirm stop").click()
    wait_until(lambda: len(_inbox(root)) == 1, what="the stop command")
    (claimed,) = control.claim(root)
    assert claimed.command_name == "stop_after_save"
    trainer.writer.emit(
        events.CommandRejected,
        command_id=claimed.id,
        command=claimed.command_name,
        reason="not during evaluation",
    )
    control.complete(root, claimed)
    # In the Commands table, and on the line under the buttons in place of "waiting".
    expect(page.locator("code", has_text="not during evaluation")).to_be_visible(timeout=5000)
    expect(page.get_by_text("Stop after save rejected")).to_contain_text("not during evaluation")


def test_rows_that_arrive_after_the_page_opened_show_dates_and_numbers(
    browser: Any, tmp_path: Path
) -> None:
    """A page opened before the run had any checkpoint formats the rows that arrive later like
    any others: a date and time, not milliseconds since 1970; steps with thousands separators.
    (Panel derives a table's default formatters from the first frame it rendered.)"""
    root = tmp_path / "young-run"
    with FakeTrainer(root) as trainer, ServeProcess(root) as server:
        trainer.start(max_steps=100_000)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        try:
            page = context.new_page()
            page.goto(server.url)
            expect(page.get_by_role("button", name="Save now")).to_be_enabled(timeout=60_000)
            # The (empty) table is built in the browser before the row arrives, as for a user
            # who opened the page on a young run.
            expect(page.locator(".tabulator-col[tabulator-field=trigger]")).to_be_visible()
            trainer.save(12_345)
            row = page.locator(".tabulator-row", has_text="step=12345-periodic.ckpt")
            expect(row).to_be_visible(timeout=10_000)
            expect(row).to_contain_text(re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"))
            expect(row).to_contain_text("12,345")
        finally:
            context.close()


def test_scheduler_line_shows_slurms_view_of_the_job(
    browser: Any, make_run: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For a run SLURM ran, the page shows what `scontrol show job` says about its job (a
    script on PATH stands in for SLURM here; tests/slurm drives a real one), with the buttons
    that state allows: a held pending job can be released and cancelled, not held again."""
    fake = tmp_path / "bin" / "scontrol"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\necho JobId=77 JobState=PENDING Reason=JobHeldAdmin Requeue=1 Restarts=2"
        ' "UserId=$(id -un)($(id -u))"\n'  # the job is the watching user's own
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    with ServeProcess(make_run()) as server:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        try:
            page = context.new_page()
            page.goto(server.url)
            expect(page.get_by_text("JobHeldAdmin")).to_be_visible(timeout=30_000)
            expect(page.get_by_role("button", name="Release job")).to_be_enabled()
            expect(page.get_by_role("button", name="Cancel pending job…")).to_be_enabled()
            expect(page.get_by_role("button", name="Hold pending job")).to_be_disabled()
        finally:
            context.close()


# A stand-in for the browser's Notification API that records instead of showing (headless
# chromium has no notification centre); the permission prompt answers "granted".
_NOTIFICATION_STUB = """() => {
  window.__notes = []
  window.Notification = class {
    constructor(title, options) { window.__notes.push(title + ': ' + options.body) }
    static get permission() { return 'granted' }
    static requestPermission() { return Promise.resolve('granted') }
  }
}"""


def test_opt_in_browser_notification_when_an_alert_begins(
    page: Page, live: tuple[Path, FakeTrainer]
) -> None:
    """Notifications are off until the user clicks; after the click (permission granted), two
    failed saves in a row raise checkpoint_failures: the banner shows it, and the browser gets
    exactly one notification naming it."""
    _, trainer = live
    page.evaluate(_NOTIFICATION_STUB)
    button = page.get_by_role("button", name=re.compile("Browser notifications"))
    expect(button).to_have_text("Browser notifications: off")
    button.click()
    expect(button).to_have_text("Browser notifications: on")
    for step in (901, 902):
        trainer.writer.emit(
            events.CheckpointFailed, step=step, path=f"c/{step}.ckpt", trigger="periodic",
            error="OSError: [Errno 28] No space left on device",
        )  # fmt: skip
    expect(page.locator('[data-alert="checkpoint_failures"]')).to_be_visible(timeout=15_000)
    page.wait_for_function("window.__notes.length >= 1", timeout=15_000)
    notes = page.evaluate("window.__notes")
    assert len(notes) == 1 and "checkpoint failures" in notes[0], notes
    assert "No space left" in notes[0]
