"""The served page's layout and theme in a real browser (Debian's chromium, driven by
Playwright) against one `ckptdash serve` of the sample run: it never scrolls sideways, and
it follows the system's dark theme (readable text, no white boxes) with a toggle.

Without chromium these tests skip, saying how to install it; in CI (CI=true) they fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ckptdash._dev.sample import write_sample_run
from ckptdash._dev.testing import ServeProcess, launch_chromium, require_chromium

pytestmark = pytest.mark.ui

require_chromium()

from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402

WIDTHS = (1024, 1440, 2560)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`ckptdash serve` of the sample run (three attempts, a preemption, a kill, a command)."""
    root = tmp_path_factory.mktemp("page") / "sample"
    write_sample_run(root)
    with ServeProcess(root) as proc:
        yield proc.url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_playwright() as p:
        b = launch_chromium(p)
        yield b
        b.close()


def _open(browser: Any, url: str, **context: Any) -> tuple[Any, Page]:
    ctx = browser.new_context(viewport={"width": WIDTHS[0], "height": 900}, **context)
    page = ctx.new_page()
    page.goto(url)
    # Loaded once the bottom of the page (the table) and the metrics plot's hint are drawn.
    expect(page.get_by_text("click the plot to choose")).to_be_visible(timeout=90_000)
    expect(page.get_by_text("What happened")).to_be_visible()
    return ctx, page


def _widest(page: Page) -> dict[str, Any]:
    return dict(
        page.evaluate(
            "() => ({scroll: document.documentElement.scrollWidth, inner: window.innerWidth})"
        )
    )


def test_the_page_never_scrolls_sideways(browser: Any, server: str) -> None:
    """At 1024, 1440 and 2560 px the page is no wider than the window: no line, pane or plot
    sticks out (a full-width pane plus its margin, or a hint beside a button, did)."""
    ctx, page = _open(browser, server)
    try:
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": 900})
            page.wait_for_function(f"() => window.innerWidth === {width}")
            page.wait_for_function(
                "() => document.documentElement.scrollWidth <= window.innerWidth", timeout=5000
            )
            sizes = _widest(page)
            assert sizes["scroll"] <= sizes["inner"] == width, sizes
    finally:
        ctx.close()
