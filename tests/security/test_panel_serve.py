"""`panel serve ckptdash` (Panel's own server, without ckptdash's token gate) in a real browser.

Anyone who can reach its port can open the page, so without a login the page only watches:
every control is off and says why (and the actions refuse on the server too:
tests/dash/test_views.py). Behind Panel's own login (``--basic-auth``) the logged-in user's
page acts, and the command it writes names that user.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckptdash import control
from ckptdash._dev.testing import FakeTrainer, launch_chromium, require_chromium
from ckptdash.dash.access import PANEL_SERVE_NO_LOGIN, panel_serve_lock

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "correct-horse-battery"


def test_the_lock_opens_only_for_a_logged_in_user() -> None:
    class Config:
        def __init__(self, basic_auth: str | None = None, oauth_provider: str | None = None):
            self.basic_auth, self.oauth_provider = basic_auth, oauth_provider

    assert panel_serve_lock(Config(), None) == PANEL_SERVE_NO_LOGIN
    assert panel_serve_lock(Config(), "me") == PANEL_SERVE_NO_LOGIN  # no login asked: no user
    assert panel_serve_lock(Config(basic_auth="pw"), None) == PANEL_SERVE_NO_LOGIN
    assert panel_serve_lock(Config(basic_auth="pw"), "guest") == PANEL_SERVE_NO_LOGIN
    assert panel_serve_lock(Config(basic_auth="pw"), "me") == ""
    assert panel_serve_lock(Config(oauth_provider="github"), "me") == ""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = launch_chromium(p)
        yield b
        b.close()


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Path]:
    with FakeTrainer(tmp_path / "run") as trainer:
        trainer.start(max_steps=1000, job_id="4242")
        trainer.save(1)
        yield tmp_path / "run"


class PanelServe:
    """``panel serve ckptdash --args RUN [OPTIONS]`` from the repository root, as documented."""

    def __init__(self, run: Path, *options: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "panel", "serve", "ckptdash", "--port", str(self.port)]
        self.proc = subprocess.Popen(
            [*cmd, *options, "--args", str(run)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"http://localhost:{self.port}/ckptdash"

    def __enter__(self) -> PanelServe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def _open(browser: Any, url: str) -> Any:
    from playwright.sync_api import Error

    page = browser.new_context().new_page()
    for _ in range(300):  # the server is still starting: retry until it answers
        try:
            page.goto(url)
            return page
        except Error:
            page.wait_for_timeout(100)
    pytest.fail(f"{url} did not answer")


def test_without_a_login_the_page_only_watches(browser: Any, run: Path) -> None:
    from playwright.sync_api import expect

    with PanelServe(run) as server:
        page = _open(browser, server.url)
        expect(page.get_by_text("Controls are off")).to_be_visible(timeout=90_000)
        expect(page.get_by_text("asks no login here")).to_be_visible()
        for name in ("Save now", "Stop after save…", "Suspend auto-requeue"):
            expect(page.get_by_role("button", name=name)).to_be_disabled()
        page.context.close()
    assert list((run / "control" / "inbox").glob("*")) == []


def test_behind_panels_login_the_logged_in_user_acts(browser: Any, run: Path) -> None:
    from playwright.sync_api import expect

    options = ("--basic-auth", PASSWORD, "--cookie-secret", "test-" + "s" * 32)
    with PanelServe(run, *options) as server:
        page = _open(browser, server.url)
        page.fill("input[name=username]", "alice")
        page.fill("input[name=password]", PASSWORD)
        page.keyboard.press("Enter")
        save = page.get_by_role("button", name="Save now")
        expect(save).to_be_enabled(timeout=90_000)
        expect(page.get_by_text("Controls are off")).to_have_count(0)
        save.click()
        expect(page.get_by_text("Save now sent")).to_be_visible(timeout=30_000)
        page.context.close()
    (command,) = control.claim(run)
    assert command.command is not None and command.command_name == "save_now"
    assert command.command.author == "alice (dashboard)"
