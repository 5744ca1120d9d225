"""The notebook widget after a browser reload, in a real JupyterLab (the kernel still running).

A reload gives the tab a new page: no BokehJS, no Panel, no comms. The user re-runs the
``ckptdash.dashboard(...)`` cell in the same kernel; the widget must show the run and keep
following it, as TensorBoard's and W&B's tabs do. The server, kernel and chromium are
test_jupyterlab.py's (skipped, or failing in CI, as it is).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import nbformat
import pytest

from ckptdash import events as ev
from ckptdash._dev.testing import launch_chromium
from ckptdash.rundir.writer import EventWriter
from tests.notebooks.test_jupyterlab import (  # skips (fails in CI) without JupyterLab, chromium
    KERNEL,
    Lab,
    _run_cell,
    expect,
    lab,  # noqa: F401  (the fixture)
    sync_playwright,
)

if TYPE_CHECKING:
    from playwright.sync_api import Locator, Page

pytestmark = [pytest.mark.notebook, pytest.mark.ui]

RUN = "reloaded"
NOTEBOOK = "reload.ipynb"


def _append(root: Path, *kinds: tuple[type[ev.Event], dict[str, object]]) -> None:
    """Append events to attempt 0 of the run, as its job (alive: this test's pid) writes them."""
    with EventWriter(root / RUN, attempt=0, host=socket.gethostname()) as w:
        for kind, fields in kinds:
            w.emit(kind, **fields)  # type: ignore[arg-type]


def _signal(root: Path, name: str) -> None:
    _append(root, (ev.SignalReceived, {"step": 41, "signal": name, "action": "requeue"}))


def _widget(page: Page) -> Locator:
    return page.locator(".jp-Notebook .jp-CodeCell").nth(0).locator(".jp-OutputArea")


def _feed(widget: Locator, signal: str) -> Locator:
    """The events feed's line for a signal of attempt 0."""
    return widget.locator("li.feed-signal", has_text=f"attempt 0 got {signal}")


def _reload(page: Page) -> None:
    page.reload()
    expect(page.get_by_text(f"{KERNEL} | Idle")).to_be_visible(timeout=60_000)


def test_widget_after_a_browser_reload(lab: Lab) -> None:  # noqa: F811
    """Run ``ckptdash.dashboard(run)``, reload the tab, re-run the cell (same kernel): the widget
    shows the run and follows it (a signal written afterwards appears in its events feed).
    It was blank until the kernel restarted: Panel's JavaScript went to the first page only.
    (A saved output drawn again on reload follows the run as well; not repeated here, to keep
    this tier short: it costs an 8 MB save and a second reload.)"""
    _append(
        lab.root,
        (ev.RunStarted, {"pid": os.getpid(), "max_steps": 1000}),
        (ev.Heartbeat, {"step": 40, "metrics": {"loss": 0.5}}),
    )
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": KERNEL, "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(f'import ckptdash\nckptdash.dashboard("{RUN}")')]
    nbformat.write(nb, lab.root / NOTEBOOK)
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1400})
            page.on("dialog", lambda dialog: dialog.accept())  # "leave with unsaved changes?"
            page.goto(f"{lab.url}/lab/tree/{NOTEBOOK}?token={lab.token}")
            expect(page.get_by_text(f"{KERNEL} | Idle")).to_be_visible(timeout=60_000)
            _run_cell(page, 0)
            expect(_widget(page).get_by_role("button", name="Save now")).to_be_visible(
                timeout=60_000
            )

            # The reload comes before any save: the cell has no output, the user re-runs it.
            _reload(page)
            _run_cell(page, 0)
            widget = _widget(page)
            expect(widget.get_by_role("button", name="Save now")).to_be_visible(timeout=60_000)
            expect(widget).to_contain_text(RUN)
            expect(widget).to_contain_text("running")
            _signal(lab.root, "SIGUSR2")
            expect(_feed(widget, "SIGUSR2")).to_be_visible(timeout=20_000)
        finally:
            browser.close()
