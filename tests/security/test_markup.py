"""No text from a run's events becomes markup or script, in the notebook widget or the served
page: a run whose every string field carries a script, an HTML or a Markdown trick is shown in
real chromium, nothing runs, and the payloads read as text.

Without chromium these tests skip, saying how to install it; in CI (CI=true) they fail.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ckptdash._dev.testing import ServeProcess, launch_chromium, page_text, require_chromium
from tests.security.hostile import FOLDER_PAYLOAD, PAYLOADS, write_hostile_run

pytestmark = pytest.mark.ui
WaitUntil = Callable[..., None]
REPO = Path(__file__).resolve().parents[2]
SHOWN = (*PAYLOADS[:4], FOLDER_PAYLOAD)  # the fifth holds line separators a page reflows

require_chromium()

from playwright.sync_api import sync_playwright  # noqa: E402

# Elements anywhere in the page (shadow roots included) carrying a payload in an attribute
# that can act: an event handler, a link or source (javascript:), an injected image, svg,
# frame or script. A payload as the inert value of a form field (a metric's name in a Select's
# <option value=...>) is data, shown as text.
_INJECTED_JS = """() => {
  const found = [];
  const acting = /^(on|href$|src$|srcdoc$|action$|formaction$|xlink:href$|style$)/i;
  const injected = /^(IMG|SVG|SCRIPT|IFRAME|OBJECT|EMBED|LINK|META|A)$/i;
  const walk = (node) => {
    if (node.nodeType === Node.ELEMENT_NODE) {
      for (const a of node.attributes) {
        if (!a.value.includes("__pwned")) continue;
        if (acting.test(a.name) || injected.test(node.nodeName)) {
          found.push(node.nodeName + " " + a.name);
        }
      }
    }
    if (node.shadowRoot) walk(node.shadowRoot);
    for (const child of node.childNodes) walk(child);
  };
  walk(document.documentElement);
  return found;
}"""
# An image that fails to load, added by the test: once its onerror ran, an injected one would
# have run too (same page, same event loop, the same missing file).
_SENTINEL_JS = """() => new Promise((done) => {
  const img = document.createElement("img");
  img.onerror = () => done(true);
  img.src = "x-sentinel-" + Math.random();
  document.body.appendChild(img);
})"""


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose every event string is a payload (see tests/security/hostile.py)."""
    return write_hostile_run(tmp_path_factory.mktemp("hostile"))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_playwright() as p:
        b = launch_chromium(p)
        yield b
        b.close()


def _assert_inert_and_shown(page: Any, wait_until: WaitUntil) -> None:
    wait_until(
        lambda: all(p in page_text(page) for p in SHOWN),
        timeout=60,
        what="every payload to show as text",
    )
    assert page.evaluate(_SENTINEL_JS) is True
    assert page.evaluate("window.__pwned") is None, "a payload ran as script"
    assert page.evaluate(_INJECTED_JS) == []


def test_notebook_widget_runs_no_event_text(
    hostile: Path, browser: Any, tmp_path: Path, wait_until: WaitUntil
) -> None:
    """The widget's HTML output, put into a page as a notebook does (after Panel's inline
    JavaScript), runs none of the payloads and shows each of them as text."""
    out = tmp_path / "notebook.html"
    subprocess.run(
        [sys.executable, "-m", "tests.security.widget_page", str(hostile), str(out)],
        cwd=REPO,
        check=True,
        timeout=120,
    )
    page = browser.new_page()
    try:
        page.goto(out.as_uri())
        _assert_inert_and_shown(page, wait_until)
    finally:
        page.close()


def test_served_page_runs_no_event_text(hostile: Path, browser: Any, wait_until: WaitUntil) -> None:
    """`ckptdash serve` of the run (its folder name a payload too, so also the page title):
    nothing runs, every payload reads as text, the title is the folder's name as text."""
    with ServeProcess(hostile) as server:
        page = browser.new_page()
        try:
            page.goto(server.url)
            _assert_inert_and_shown(page, wait_until)
            assert page.title() == f"ckptdash · {FOLDER_PAYLOAD}"
        finally:
            page.close()
