"""The notebook widget under JupyterLab's **Run → Run All Cells**, with JupyterLab's default
settings (windowing on), as a new user runs a notebook the first time.

Run All queues every cell at once, so the training cell starts the moment the widget's cell
ends: whatever the widget needs from the kernel's main thread after that (the front end's
comm messages) waits for the whole training. Here the widget must still follow the training
live — the step rises while the training cell's prompt reads ``[*]`` — on a run directory
that does not exist yet when the widget is shown (it waits calmly, then attaches), and its
checkpoint table must hold the saves the timeline shows.

Without chromium, JupyterLab or Lightning the tests skip, saying how to get them; in CI
(CI=true) they fail instead (the module below is imported first and does that check).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest

from tests.notebooks import test_jupyterlab as lab_tier
from tests.notebooks.test_jupyterlab import (
    _LOOK_JS,
    CELL_END_MS,
    KERNEL,
    REPO,
    SERVER_START_S,
    TRAIN_CELL,
    Lab,
    _external,
    _free_port,
    _stop,
    _wait_for_server,
)

pytestmark = [pytest.mark.notebook, pytest.mark.ui]

from playwright.sync_api import Page, Route, expect, sync_playwright  # noqa: E402

from ckptdash._dev.testing import launch_chromium, offline_jupyter_home  # noqa: E402
from ckptdash.state.reading import load_state  # noqa: E402

# Cell 1 as a user writes it: the run directory does not exist yet (the training creates it).
WIDGET_CELL = """\
import os
from pathlib import Path

import ckptdash

Path("kernel.pid").write_text(str(os.getpid()))
run_dir = Path("runs") / "x"
ckptdash.dashboard(run_dir)"""

NOTEBOOK = "mine.ipynb"
QUICKSTART = "quickstart.ipynb"


def _home(home: Path, root: Path) -> dict[str, str]:
    """Jupyter's config, data and kernels for this test only — and JupyterLab's *default*
    settings (no settings file at all: windowing as shipped); returns the environment."""
    env = offline_jupyter_home(home, KERNEL, REPO)
    train = TRAIN_CELL.replace("enable_checkpointing=False,", "")
    train = train.replace(
        "callbacks=[CkptDashCallback(run_dir, heartbeat_interval_s=0.5)],",
        "callbacks=[CkptDashCallback(run_dir, heartbeat_interval_s=0.5),"
        " L.callbacks.ModelCheckpoint(dirpath=run_dir / 'checkpoints',"
        " every_n_train_steps=50, save_top_k=-1)],",
    )
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": KERNEL, "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(WIDGET_CELL), nbformat.v4.new_code_cell(train)]
    nbformat.write(nb, root / NOTEBOOK)
    quickstart = nbformat.read(REPO / "notebooks" / "quickstart.ipynb", as_version=4)
    quickstart.metadata["kernelspec"] = nb.metadata["kernelspec"]
    nbformat.write(quickstart, root / QUICKSTART)
    return env


def _serve(tmp_path: Path, app: str) -> Iterator[Lab]:
    """``python -m APP`` (jupyterlab or notebook) on 127.0.0.1, a free port, token auth,
    default settings, holding this test's own notebook and a copy of the shipped quickstart."""
    root = tmp_path / "root"
    root.mkdir()
    env = _home(tmp_path / "jupyter", root)
    port, token = _free_port(), secrets.token_hex(16)
    lab = Lab(f"http://127.0.0.1:{port}", token, root)
    log = tmp_path / f"{app}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                app,
                "--no-browser",
                "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={port}",
                "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={root}",
                *(["--allow-root"] if os.geteuid() == 0 else []),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=root,
            start_new_session=True,
        )
    try:
        _wait_for_server(lab, proc, log, timeout=SERVER_START_S)
        yield lab
    finally:
        _stop(proc, lab)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """JupyterLab 4 with its default settings."""
    yield from _serve(tmp_path_factory.mktemp("run-all-lab"), "jupyterlab")


@pytest.fixture(scope="module")
def nb7(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """Notebook 7 (the classic notebook's successor, built on JupyterLab's parts)."""
    yield from _serve(tmp_path_factory.mktemp("run-all-nb7"), "notebook")


def _run_all(page: Page) -> None:
    """Run → Run All Cells, through the menu as a user does."""
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless chromium for the module."""
    with sync_playwright() as p:
        b = launch_chromium(p)
        yield b
        b.close()


def _kernel_idle(lab: Lab, notebook: str) -> bool:
    """Whether the notebook's own kernel has started and is idle (asked of the server)."""
    sessions = lab.api("GET", "/api/sessions")
    states = [s["kernel"]["execution_state"] for s in sessions if s["path"] == notebook]
    return states == ["idle"]


def _open(browser: Any, lab: Lab, notebook: str, *, nb7: bool = False) -> tuple[Any, Page]:
    """The notebook open in a new offline tab, its kernel idle; then Run All Cells."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})

    def offline(route: Route) -> None:
        route.abort("internetdisconnected")

    context.route(_external, offline)
    page = context.new_page()
    if nb7:
        page.goto(f"{lab.url}/notebooks/{notebook}?token={lab.token}")
    else:  # reset: a fresh workspace, or the previous test's notebook would open as well
        page.goto(f"{lab.url}/lab/tree/{notebook}?reset&token={lab.token}")
    expect(page.locator(".jp-Notebook .jp-CodeCell").first).to_be_visible(timeout=60_000)
    # A cell run while the kernel still starts is dropped, not queued.
    deadline = time.monotonic() + 60
    while not _kernel_idle(lab, notebook):
        assert time.monotonic() < deadline, "the kernel did not become idle"
        page.wait_for_timeout(200)  # polling the server's REST API; nothing to wait on
    _run_all(page)
    return context, page


def _steps_rise_while_busy(page: Page) -> list[int]:
    """Three increasing steps in the widget, each read while the training cell is ``[*]``."""
    seen: list[int] = []
    while len(seen) < 3:
        handle = page.wait_for_function(
            _LOOK_JS, arg=seen[-1] if seen else -1, timeout=60_000, polling=100
        )
        look = handle.json_value()
        assert look["busy"], f"the training cell finished first; steps seen while busy: {seen}"
        seen.append(int(look["step"]))
    return seen


def _follows_from_a_new_run_dir(lab: Lab, browser: Any, *, nb7: bool = False) -> None:
    context, page = _open(browser, lab, NOTEBOOK, nb7=nb7)
    try:
        cells = page.locator(".jp-Notebook .jp-CodeCell")
        widget = cells.nth(0).locator(".jp-OutputArea")
        expect(widget.get_by_role("button", name="Save now")).to_be_attached(timeout=60_000)
        expect(widget).to_contain_text("waiting for the first event in runs/x")
        expect(widget).not_to_contain_text("holds no ckptdash run")
        prompt = cells.nth(1).locator(".jp-InputPrompt")
        expect(prompt).to_contain_text("*", timeout=60_000)
        _steps_rise_while_busy(page)
        widget.get_by_role("button", name="Save now").click()
        expect(widget.get_by_text("Save now applied")).to_be_visible(timeout=CELL_END_MS)
        expect(prompt).to_contain_text("*")
        lab_tier.stop(widget)
        expect(prompt).to_have_text("[2]:", timeout=CELL_END_MS)
        run = lab.root / "runs" / "x"
        saved = [c for c in load_state(run).checkpoints.values() if c.status == "saved"]
        assert any(c.trigger == "manual" for c in saved), saved
        expect(widget.locator(".tabulator-row")).to_have_count(len(saved), timeout=20_000)
        expect(widget).not_to_contain_text("Traceback")
    finally:
        context.close()


def test_run_all_widget_follows_training_from_a_run_dir_that_does_not_exist_yet(
    lab: Lab, browser: Any
) -> None:
    """Run All on [widget on runs/x, which does not exist; train into runs/x]: the widget first
    says it waits for the first event in runs/x (no red error), then, while the training cell
    is still ``[*]``, shows the step rising, and its Save now makes the training save (the
    answer shows while the cell runs); Stop after save ends the cell, and after it the
    checkpoint table lists every save the run recorded."""
    _follows_from_a_new_run_dir(lab, browser)


def test_run_all_in_notebook_7_follows_training_too(nb7: Lab, browser: Any) -> None:
    """The same notebook and checks in Notebook 7 (Run → Run All Cells)."""
    _follows_from_a_new_run_dir(nb7, browser, nb7=True)


def test_run_all_on_the_shipped_quickstart_follows_the_training(lab: Lab, browser: Any) -> None:
    """The quickstart as shipped, Run All: the widget's step rises while cell 2 trains, and
    after it the table holds every checkpoint the run recorded."""
    context, page = _open(browser, lab, QUICKSTART)
    try:
        cells = page.locator(".jp-Notebook .jp-CodeCell")
        prompt = cells.nth(1).locator(".jp-InputPrompt")
        expect(prompt).to_contain_text("*", timeout=60_000)
        _steps_rise_while_busy(page)
        expect(cells.nth(2).locator(".jp-InputPrompt")).to_have_text("[3]:", timeout=120_000)
        (run,) = (lab.root / "runs").glob("quickstart-*")
        saved = [c for c in load_state(run).checkpoints.values() if c.status == "saved"]
        assert saved
        widget = cells.nth(0).locator(".jp-OutputArea")
        expect(widget.locator(".tabulator-row")).to_have_count(len(saved), timeout=20_000)
    finally:
        context.close()
