"""The goodput panel and the metrics plot in a real browser (Debian's chromium, driven by
Playwright) against a real `ckptdash serve` of the sample run (three attempts, a loss curve):
both render, and a checkpoint chosen by clicking the plot becomes the resume pin.

Without chromium these tests skip, saying how to install it; in CI (CI=true) they fail.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ckptdash import control
from ckptdash._dev.sample import write_sample_run
from ckptdash._dev.testing import ServeProcess, launch_chromium, require_chromium
from ckptdash.dash.views.metrics import PLOT_NAME
from ckptdash.state.reading import load_state

pytestmark = pytest.mark.ui

require_chromium()

from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402

# The page position of data point (step, middle of the plot's height), from Bokeh's own scales.
_POINT_JS = """([name, step]) => {
  const views = [...Bokeh.index.all_views()];
  const plot = views.find((v) => v.model.name === name && v.frame !== undefined);
  if (plot === undefined) return null;
  const box = plot.canvas_view.el.getBoundingClientRect();
  const frame = plot.frame.bbox;
  return [box.left + plot.frame.x_scale.compute(step), box.top + frame.top + frame.height / 2];
}"""


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample run: preempted with a signal, killed without warning, training now."""
    root = tmp_path_factory.mktemp("goodput-ui") / "sample"
    write_sample_run(root)
    return root


@pytest.fixture(scope="module")
def page(sample: Path) -> Iterator[Page]:
    """`ckptdash serve` of the sample run, open in one chromium tab for the module."""
    with ServeProcess(sample) as server, sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            tab = browser.new_context(viewport={"width": 1400, "height": 1200}).new_page()
            tab.goto(server.url)
            expect(tab.get_by_role("button", name="Save now")).to_be_enabled(timeout=90_000)
            yield tab
        finally:
            browser.close()


def test_goodput_panel_shows_a_bar_for_the_run_and_each_attempt(page: Page) -> None:
    """The panel says where the time went: a stacked bar for the run and one per attempt, with
    lost work and requeue wait segments (attempt 1 was killed without warning), and the
    Young/Daly advice with the expected goodput at the advised interval."""
    panel = page.locator(".gp")
    expect(panel).to_contain_text("Where the time went")
    expect(panel.locator(".gp-row")).to_have_count(4)  # the run and three attempts
    expect(panel.locator(".gp-lost_work").first).to_be_visible()
    expect(panel.locator(".gp-requeue_wait").first).to_be_visible()
    expect(page.locator(".gp-advice")).to_contain_text("expected goodput at the Daly interval")


_Y_SCALE_JS = """(name) => {
  const plot = [...Bokeh.index.all_views()].find((v) => v.model.name === name && v.frame);
  return plot === undefined ? null : plot.model.y_scale.type;
}"""


def test_metrics_plot_draws_the_loss_and_offers_every_metric_and_a_log_scale(page: Page) -> None:
    """The metrics plot is on the page with the loss chosen; lr is selectable too; the log
    scale box redraws it with a logarithmic y axis, and back."""
    select = page.get_by_role("combobox").filter(has_text="loss")
    expect(select).to_be_visible()
    assert sorted(select.locator("option").all_inner_texts()) == ["loss", "lr"]
    assert page.evaluate(_POINT_JS, [PLOT_NAME, 0]) is not None
    assert page.evaluate(_Y_SCALE_JS, PLOT_NAME) == "LinearScale"
    # Panel draws the checkbox's text as a sibling <div>, not a <label>: find it by that.
    box = page.locator("input[type=checkbox]:has(+ .bk-label:text-is('log scale'))")
    box.click()
    page.wait_for_function(f"() => ({_Y_SCALE_JS})({PLOT_NAME!r}) === 'LogScale'")
    box.click()
    page.wait_for_function(f"() => ({_Y_SCALE_JS})({PLOT_NAME!r}) === 'LinearScale'")


def test_choosing_a_checkpoint_on_the_plot_pins_it(
    page: Page, sample: Path, wait_until: Callable[..., None]
) -> None:
    """Click the plot at an older checkpoint's step: it is chosen; "Resume from chosen save"
    writes it as the resume pin, as `ckptdash resume --pin` would."""
    older = load_state(sample).valid_checkpoints()[1]  # not the one the rule would pick
    assert older.step is not None
    xy: Any = page.evaluate(_POINT_JS, [PLOT_NAME, older.step])
    page.mouse.click(xy[0], xy[1])
    expect(page.locator(".chosen-step")).to_have_text(f"step {older.step:,}", timeout=10_000)
    page.get_by_role("button", name="Resume from chosen save").click()
    wait_until(lambda: control.read_settings(sample).resume_pin == older.path, what="the pin")
