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
                "() => document.documentElement.scrollWidth <= window.innerWidth",
                timeout=60_000,  # the re-layout after a resize: 5 s was too short under load
            )
            sizes = _widest(page)
            assert sizes["scroll"] <= sizes["inner"] == width, sizes
    finally:
        ctx.close()


# The text colour of the dashboard's own HTML and the page's background, as the browser
# computed them (the dashboard's panes live in Panel's shadow roots).
_COLOURS_JS = """() => {
  const find = (root) => {
    for (const el of root.querySelectorAll('*')) {
      if (el.classList && el.classList.contains('ck') && el.textContent.trim()) return el;
      if (el.shadowRoot) { const f = find(el.shadowRoot); if (f) return f; }
    }
    return null;
  };
  const el = find(document);
  // The background behind it: the first ancestor (across shadow roots) that paints one.
  let at = el, page = 'rgba(0, 0, 0, 0)';
  while (at) {
    const bg = getComputedStyle(at).backgroundColor;
    if (bg !== 'rgba(0, 0, 0, 0)' && bg !== 'transparent') { page = bg; break; }
    at = at.parentElement || (at.getRootNode() && at.getRootNode().host) || null;
  }
  if (!at) page = getComputedStyle(document.documentElement).backgroundColor;
  return {text: getComputedStyle(el).color, page: page};
}"""


def _rgb(css: str) -> tuple[float, ...]:
    """``rgb(r, g, b)``; a transparent page background is the browser's white canvas."""
    parts = [float(x) for x in css[css.index("(") + 1 : css.index(")")].split(",")]
    return (255.0, 255.0, 255.0) if len(parts) == 4 and parts[3] == 0 else tuple(parts[:3])


def _contrast(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    def lum(c: tuple[float, ...]) -> float:
        ch = [x / 255 for x in c]
        lin = [x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in ch]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def _white_boxes(page: Page, tile: int = 24) -> int:
    """Tiles of ``tile`` px of the whole page that are (almost) all white: a white box."""
    import io

    import numpy as np
    from PIL import Image

    shot = np.asarray(Image.open(io.BytesIO(page.screenshot(full_page=True))).convert("RGB"))
    white = shot.min(axis=2) >= 235
    h, w = (white.shape[0] // tile) * tile, (white.shape[1] // tile) * tile
    tiles = white[:h, :w].reshape(h // tile, tile, w // tile, tile).mean(axis=(1, 3))
    return int((tiles > 0.9).sum())


def test_a_dark_system_gets_a_readable_dark_page_and_a_toggle(browser: Any, server: str) -> None:
    """A browser whose system prefers dark gets the dark page (?theme=dark) on its own: the
    dashboard's text reads on its background (contrast at least 4.5:1, WCAG AA) and nothing
    on the page is a white box (plots, tables, code, banners). The toggle goes back to the
    light page, and says it would go dark again."""
    ctx, page = _open(browser, server, color_scheme="dark")
    try:
        page.wait_for_url("**theme=dark**")
        expect(page.get_by_text("click the plot to choose")).to_be_visible(timeout=90_000)
        colours = page.evaluate(_COLOURS_JS)
        assert _contrast(_rgb(colours["text"]), _rgb(colours["page"])) >= 4.5, colours
        assert _white_boxes(page) == 0
        page.get_by_role("button", name="Light theme").click()
        page.wait_for_url("**theme=default**")
        expect(page.get_by_role("button", name="Dark theme")).to_be_visible(timeout=90_000)
        expect(page.get_by_text("click the plot to choose")).to_be_visible(timeout=90_000)
        colours = page.evaluate(_COLOURS_JS)
        assert _contrast(_rgb(colours["text"]), _rgb(colours["page"])) >= 4.5, colours
        assert _white_boxes(page) > 100  # the light page, as asked
    finally:
        ctx.close()
