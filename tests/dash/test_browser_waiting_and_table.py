"""What a new user sees first in the browser: `ckptdash serve` on a folder with no run yet
waits calmly and attaches when the training starts, and the checkpoint table shows whole
dates and paths relative to the run (the full path on hover).

Without chromium these tests skip, saying how to install it; in CI (CI=true) they fail.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckptdash._dev.testing import FakeTrainer, ServeProcess, launch_chromium, require_chromium

pytestmark = pytest.mark.ui

require_chromium()

from playwright.sync_api import expect, sync_playwright  # noqa: E402


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless chromium for the module."""
    with sync_playwright() as p:
        b = launch_chromium(p)
        yield b
        b.close()


def test_serve_on_an_empty_folder_waits_then_attaches_to_the_run(
    browser: Any, tmp_path: Path
) -> None:
    """`ckptdash serve runs/` on an empty folder says in the terminal that it holds no run
    yet; the page says it waits for the first event (no red error). When a training starts
    writing runs/exp1, the page shows it and its first checkpoint, without a reload: the
    time whole (not cut to "2026-12-0"), the file relative to the run, the full path on
    hover."""
    folder = tmp_path / "runs"
    folder.mkdir()
    with ServeProcess(folder) as server:
        assert "holds no run yet" in server.log()
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        try:
            page = context.new_page()
            page.goto(server.url)  # whatever URL the server printed (it may carry a token)
            expect(page.get_by_text(f"waiting for the first event in {folder}")).to_be_visible(
                timeout=60_000
            )
            expect(page.locator(".problem")).to_have_count(0)
            with FakeTrainer(folder / "exp1") as trainer:
                trainer.start(max_steps=100)
                trainer.save(7)
                row = page.locator(".tabulator-row", has_text="step=7-periodic.ckpt")
                expect(row).to_be_visible(timeout=30_000)
            time_cell = row.locator("[tabulator-field=time]")
            expect(time_cell).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$"))
            scroll, client = time_cell.evaluate("e => [e.scrollWidth, e.clientWidth]")
            assert scroll <= client, "the time is cut off"
            file_cell = row.locator("[tabulator-field=file] span")
            expect(file_cell).to_have_text("checkpoints/step=7-periodic.ckpt")
            full = str(folder / "exp1" / "checkpoints" / "step=7-periodic.ckpt")
            expect(file_cell).to_have_attribute("title", full)
        finally:
            context.close()
