"""The notebook widget keeps updating while another cell trains, in a real JupyterLab.

The README's claim: ``ckptdash.dashboard(run_dir)`` in one cell, ``trainer.fit(...)`` in the
next, and the widget follows the training while that cell blocks. nbclient (test_notebooks.py)
proves the cells run, but not that a browser shows anything, nor that updates reach the page
while the kernel's main thread is busy. Here a real JupyterLab server (its own process, token
auth, offline), a real kernel, real Lightning training on CPU and Debian's chromium driven by
Playwright show it: the step in the widget's header advances while the training cell's prompt
still reads ``[*]``.

Without chromium, JupyterLab or Lightning the test skips, saying how to get them; in CI
(CI=true) it fails instead.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import nbformat
import pytest

from ckptdash._dev.testing import (
    HOW_TO_GET_CHROMIUM,
    chromium_path,
    launch_chromium,
    offline_jupyter_home,
)
from ckptdash.state.reading import load_state

pytestmark = [pytest.mark.notebook, pytest.mark.ui]

HOW_TO_GET_JUPYTERLAB = "install the test extras: .venv/bin/pip install -e '.[test,lightning]'"
_missing = [
    why
    for why, absent in (
        (f"no chromium; {HOW_TO_GET_CHROMIUM}", chromium_path() is None),
        (f"no jupyterlab; {HOW_TO_GET_JUPYTERLAB}", importlib.util.find_spec("jupyterlab") is None),
        (f"no lightning; {HOW_TO_GET_JUPYTERLAB}", importlib.util.find_spec("lightning") is None),
    )
    if absent
]
if _missing:
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"CI=true but {'; '.join(_missing)}")
    pytest.skip("; ".join(_missing), allow_module_level=True)

from playwright.sync_api import Locator, Page, Route, expect, sync_playwright  # noqa: E402

REPO = Path(__file__).parents[2]
KERNEL = "ckptdash-test-venv"
NOTEBOOK = "live.ipynb"
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
CELL_END_MS = 120_000  # a bound on a stopped training cell's end: its save and fit()'s return
SERVER_START_S = 180  # a bound on a server's start: 5 s on two free cores, minutes when starved

# Cell 1: the widget, as the quickstart shows it. The kernel's pid lets the teardown make sure
# the kernel is gone even if the server did not stop it.
WIDGET_CELL = """\
import os
from pathlib import Path

import ckptdash

Path("kernel.pid").write_text(str(os.getpid()))
run_dir = Path("run")
run_dir.mkdir()
dash = ckptdash.dashboard(run_dir)
dash"""

# Cell 2: the quickstart's tiny Lightning model, trained until the test stops it from the
# widget (Stop after save): the cell is busy for as long as the test looks, however slow the
# machine, and no longer.
TRAIN_CELL = """\
import time

import lightning.pytorch as L
import torch

from ckptdash.lightning import CkptDashCallback


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        time.sleep(0.03)  # a step long enough to watch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


torch.manual_seed(0)
x = torch.randn(2048, 16)
loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=32
)
trainer = L.Trainer(
    max_steps=100_000,
    callbacks=[CkptDashCallback(run_dir, heartbeat_interval_s=0.5)],
    default_root_dir=run_dir,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    accelerator="cpu",
)
trainer.fit(Regressor(), loader)"""

# One look at the page, taken at one instant: the step in the widget's header (cell 1's
# output; Panel renders it inside shadow roots) and whether cell 2 is still busy (``[*]``).
# Returns null (keep waiting) until the step exceeds ``last`` or cell 2 is no longer busy.
_LOOK_JS = """(last) => {
  const cells = document.querySelectorAll(".jp-Notebook .jp-CodeCell");
  if (cells.length < 2) return null;
  const busy = cells[1].querySelector(".jp-InputPrompt").textContent.includes("*");
  let step = null;
  const walk = (node) => {
    if (step !== null) return;
    if (node.nodeName === "LABEL" && node.textContent.trim() === "step") {
      // "1,234 / 100,000": the step is what comes before the slash (the max steps after it;
      // before the first heartbeat the step is a dash and only the max steps is a number).
      const value = node.nextElementSibling ? node.nextElementSibling.textContent : "";
      const found = value.split("/")[0].replace(/,/g, "").match(/\\d+/);
      if (found) step = Number(found[0]);
      return;
    }
    if (node.shadowRoot) walk(node.shadowRoot);
    for (const child of node.children || []) walk(child);
  };
  walk(cells[0].querySelector(".jp-OutputArea"));
  if (!busy || (step !== null && step > last)) return { step, busy };
  return null;
}"""


@dataclass
class Lab:
    """A running JupyterLab server: where it serves, its token and its root folder."""

    url: str
    token: str
    root: Path

    def api(self, method: str, path: str) -> Any:
        """One call to the server's REST API (token auth); the decoded JSON, or None."""
        request = urllib.request.Request(
            f"{self.url}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_home(home: Path, root: Path) -> dict[str, str]:
    """Jupyter's config, data, settings and kernels for this test only; returns the environment.

    Nothing from the user's own Jupyter set-up takes part, and nothing leaves the machine.
    """
    env = offline_jupyter_home(home, KERNEL, REPO)
    settings = home / "settings" / "@jupyterlab"
    # JupyterLab 4 removes off-screen cells from the DOM ("windowing"): the widget's cell must
    # stay in the page while the next cell's output grows.
    tracker = settings / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    tracker.write_text(json.dumps({"windowingMode": "none"}))
    notification = settings / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True)
    notification.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": KERNEL, "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(WIDGET_CELL), nbformat.v4.new_code_cell(TRAIN_CELL)]
    nbformat.write(nb, root / NOTEBOOK)

    return env


def _wait_for_server(lab: Lab, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            lab.api("GET", "/api/status")
            return
        except OSError:
            time.sleep(0.2)  # the server is still starting; nothing to wait on but the port
    raise RuntimeError(f"JupyterLab did not start within {timeout} s:\n{log.read_text()}")


def _stop(proc: subprocess.Popen[bytes], lab: Lab) -> None:
    """Shut the kernels down through the API, then the server, then anything left over."""
    with contextlib.suppress(Exception):
        for kernel in lab.api("GET", "/api/kernels"):
            lab.api("DELETE", f"/api/kernels/{kernel['id']}")
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    # The kernel runs in a session of its own (jupyter_client starts it so), out of reach of
    # the server's process group: it must not outlive the test even if the server died early.
    pid_file = lab.root / "kernel.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text())
        deadline = time.monotonic() + 10
        while _is_kernel(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _is_kernel(pid):
            os.kill(pid, signal.SIGKILL)


def _is_kernel(pid: int) -> bool:
    """Whether ``pid`` is still a live ipykernel (a zombie, or a reused pid, is not)."""
    proc = Path(f"/proc/{pid}")
    try:
        state = proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = proc.joinpath("cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z" and b"ipykernel_launcher" in cmdline


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    """`jupyter lab` as a user starts it, on 127.0.0.1, a free port, token auth, no browser,
    a temporary root folder holding the notebook; stopped with its kernels afterwards."""
    root = tmp_path / "root"
    root.mkdir()
    env = _write_home(tmp_path / "jupyter", root)
    port, token = _free_port(), secrets.token_hex(16)
    lab = Lab(f"http://127.0.0.1:{port}", token, root)
    log = tmp_path / "jupyterlab.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyterlab",
                "--no-browser",
                "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={port}",
                "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={root}",
                # Containers often run as root; Jupyter refuses to unless told.
                *(["--allow-root"] if os.geteuid() == 0 else []),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=root,
            start_new_session=True,  # one signal to its group stops it and its helpers
        )
    try:
        _wait_for_server(lab, proc, log, timeout=SERVER_START_S)
        yield lab
    finally:
        _stop(proc, lab)


def _external(url: str) -> bool:
    """A request that leaves this machine (data: and blob: URLs never do)."""
    parts = urlparse(url)
    return parts.scheme in ("http", "https", "ws", "wss") and parts.hostname not in LOCAL_HOSTS


def _run_cell(page: Page, index: int) -> None:
    """Select code cell ``index`` and run it with Shift+Enter, as a user does."""
    cell = page.locator(".jp-Notebook .jp-CodeCell").nth(index)
    cell.locator(".jp-InputPrompt").click()  # selects the cell in command mode
    page.keyboard.press("Shift+Enter")


def stop(widget: Locator) -> None:
    """Stop after save, confirmed, in the widget ``widget``: the training cell's way out."""
    widget.get_by_role("button", name="Stop after save…").click()
    widget.get_by_role("button", name="Confirm stop").click()
    expect(widget.get_by_text("Stop after save applied")).to_be_visible(timeout=CELL_END_MS)


def _look(page: Page, last: int, timeout_ms: float) -> dict[str, Any]:
    """Wait until the widget's step exceeds ``last`` or the training cell is done."""
    handle = page.wait_for_function(_LOOK_JS, arg=last, timeout=timeout_ms, polling=100)
    value: dict[str, Any] = handle.json_value()
    return value


def test_widget_follows_training_while_the_cell_runs(lab: Lab) -> None:
    """In JupyterLab, cell 1 shows ``ckptdash.dashboard(run_dir)``; cell 2 trains a Lightning
    model. While cell 2 is still running, the step in cell 1's widget advances at least twice
    (three increasing values, each read while cell 2's prompt is ``[*]``); a click on the
    widget's Save now makes the training save, answered in the widget while the cell runs; its
    Stop after save, confirmed, saves again and ends the cell. The browser has no internet:
    the widget's JavaScript must come inline from the kernel."""
    # Without this the widget's cell may leave the DOM once the notebook scrolls to cell 2.
    tracker = lab.api("GET", "/lab/api/settings/@jupyterlab/notebook-extension:tracker")
    assert tracker["settings"]["windowingMode"] == "none"
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            # Tall, so that both cells are on screen anyway.
            context = browser.new_context(viewport={"width": 1400, "height": 1600})
            blocked: list[tuple[str, str]] = []

            def offline(route: Route) -> None:
                # As on an offline login node: whatever would leave the machine fails.
                blocked.append((route.request.resource_type, route.request.url))
                route.abort("internetdisconnected")

            context.route(_external, offline)
            page = context.new_page()
            page.goto(f"{lab.url}/lab/tree/{NOTEBOOK}?token={lab.token}")
            cells = page.locator(".jp-Notebook .jp-CodeCell")
            expect(cells).to_have_count(2, timeout=60_000)
            # Wait for the kernel (the status bar's "KERNEL | Idle"): a cell run while the
            # kernel still initializes is dropped, not queued.
            expect(page.get_by_text(f"{KERNEL} | Idle")).to_be_visible(timeout=60_000)

            _run_cell(page, 0)
            # The widget rendered: Panel's JavaScript loaded inline and built the view, with the
            # first read of the (still empty) run directory already in it: a change sent
            # before the page opens the widget's comm would be lost, so dashboard() waits for
            # that read instead of leaving the header at "reading ..." until training starts.
            widget = cells.nth(0).locator(".jp-OutputArea")
            expect(widget.get_by_role("button", name="Save now")).to_be_visible(timeout=60_000)
            expect(widget).not_to_contain_text("reading")

            _run_cell(page, 1)
            prompt = cells.nth(1).locator(".jp-InputPrompt")
            expect(prompt).to_contain_text("*", timeout=60_000)
            seen: list[int] = []
            while len(seen) < 3:
                look = _look(page, seen[-1] if seen else -1, timeout_ms=60_000)
                assert look["busy"], f"cell 2 finished first; steps seen while busy: {seen}"
                seen.append(int(look["step"]))
            assert seen == sorted(set(seen)), seen

            # Save now in the widget while the cell trains: the click is handled by a kernel
            # subshell (the main thread is busy in fit()), the job saves at its next step, and
            # the widget shows the command applied, all before the cell ends.
            run = lab.root / "run"
            widget.get_by_role("button", name="Save now").click()
            applied = widget.locator("td", has_text="applied")
            expect(applied.first).to_be_visible(timeout=CELL_END_MS)
            expect(prompt).to_contain_text("*")
            manual = [c for c in load_state(run).checkpoints.values() if c.trigger == "manual"]
            assert len(manual) == 1 and manual[0].status == "saved", manual

            # Stop after save, confirmed in the widget: the job saves, fit() returns and the
            # cell ends; the training was real, and it ends when the user says so.
            stop(widget)
            expect(prompt).to_have_text("[2]:", timeout=CELL_END_MS)
            state = load_state(run)
            [(outcome, last_step)] = [(a.outcome, a.step) for a in state.attempts.values()]
            assert outcome == "stopped"
            assert last_step is not None and last_step >= seen[-1]
            stops = [c for c in state.checkpoints.values() if c.trigger == "manual"]
            assert len(stops) == 2 and all(c.status == "saved" for c in stops), stops

            # Everything is local: scripts, data and stylesheets (Panel's own HTML pane would
            # re-link its CSS from cdn.holoviz.org at every update; ckptdash's does not).
            assert blocked == [], f"the widget asked other hosts for {blocked[:5]}"
            context.close()
        finally:
            browser.close()


def _set_theme(lab: Lab, theme: str) -> None:
    """Switch JupyterLab's theme, as Settings > Theme > JupyterLab Dark does."""
    body = json.dumps({"raw": json.dumps({"theme": theme})}).encode()
    request = urllib.request.Request(
        f"{lab.url}/lab/api/settings/@jupyterlab/apputils-extension:themes",
        data=body,
        method="PUT",
        headers={"Authorization": f"token {lab.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10):
        pass


# The widget's own text colour and the colour painted behind it (across shadow roots).
_WIDGET_COLOURS_JS = """(area) => {
  const find = (root) => {
    for (const el of root.querySelectorAll('*')) {
      if (el.classList && el.classList.contains('ck') && el.textContent.trim()) return el;
      if (el.shadowRoot) { const f = find(el.shadowRoot); if (f) return f; }
    }
    return null;
  };
  const el = find(area);
  let at = el, bg = null;
  while (at && !bg) {
    const c = getComputedStyle(at).backgroundColor;
    if (c !== 'rgba(0, 0, 0, 0)' && c !== 'transparent') bg = c;
    at = at.parentElement || (at.getRootNode() && at.getRootNode().host) || null;
  }
  return {text: getComputedStyle(el).color, page: bg,
          light: document.body.dataset.jpThemeLight};
}"""


def test_widget_follows_jupyterlab_dark(lab: Lab) -> None:
    """In JupyterLab Dark the widget of the sample run is dark too: its text reads on the
    notebook's background (contrast at least 4.5:1) and no part of it is a white box (tables,
    plots, code, banners take JupyterLab's colours)."""
    import io

    import numpy as np
    from PIL import Image

    from ckptdash._dev.sample import write_sample_run
    from tests.dash.test_page_browser import _contrast, _rgb

    write_sample_run(lab.root / "sample")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": KERNEL, "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell('import ckptdash\nckptdash.dashboard("sample")')]
    nbformat.write(nb, lab.root / "dark.ipynb")
    _set_theme(lab, "JupyterLab Dark")
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            page.goto(f"{lab.url}/lab/tree/dark.ipynb?token={lab.token}")
            expect(page.get_by_text(f"{KERNEL} | Idle")).to_be_visible(timeout=60_000)
            _run_cell(page, 0)
            widget = page.locator(".jp-Notebook .jp-CodeCell").nth(0).locator(".jp-OutputArea")
            expect(widget.get_by_text("What happened")).to_be_visible(timeout=60_000)
            expect(widget.get_by_text("Checkpoints", exact=True)).to_be_visible()
            colours = widget.evaluate(_WIDGET_COLOURS_JS)
            assert colours["light"] == "false", colours
            assert _contrast(_rgb(colours["text"]), _rgb(colours["page"])) >= 4.5, colours
            shot = np.asarray(Image.open(io.BytesIO(widget.screenshot())).convert("RGB"))
            white = shot.min(axis=2) >= 235
            t = 24
            h, w = (white.shape[0] // t) * t, (white.shape[1] // t) * t
            tiles = white[:h, :w].reshape(h // t, t, w // t, t).mean(axis=(1, 3))
            assert int((tiles > 0.9).sum()) == 0, "white boxes in the widget"
        finally:
            browser.close()
