"""Refresh the README's pictures: ``assets/dashboard.png``, ``dashboard-dark.png``, ``widget.png``.

    .venv/bin/python scripts/screenshot.py [--only dashboard|widget] [--width 1400]

``dashboard.png``: a real ``ckptdash demo`` run (a shorter one: two preemptions, a
kill without warning, the last attempt training) served by ``start_server`` and
photographed by the system chromium while its last attempt trains.
``dashboard-dark.png``: the same page at the same moment in a browser that prefers dark
(the page follows the system: ``?theme=dark``).

``widget.png``: the shipped ``notebooks/quickstart.ipynb`` in a real JupyterLab
(its own server, kernel and settings in a temporary folder; default settings),
Run → Run All Cells, photographed while the training cell runs.

The PNGs are reduced to a 256-colour palette when Pillow is installed, to keep
them small (the goal is < 300 KB each).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from playwright.sync_api import expect, sync_playwright

from ckptdash._dev.testing import launch_chromium, offline_jupyter_home
from ckptdash.cli.demo import run_demo
from ckptdash.dash.server import start_server

ROOT = Path(__file__).resolve().parent.parent
KERNEL = "ckptdash-screenshot"


def shrink(png: bytes) -> bytes:
    """The same picture with a 256-colour palette (UI screenshots barely change)."""
    try:
        from PIL import Image
    except ImportError:
        return png
    image = Image.open(io.BytesIO(png)).convert("RGB")
    out = io.BytesIO()
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(out, "PNG", optimize=True)
    return out.getvalue() if out.tell() < len(png) else png


def dashboard_pngs(browser: Any, width: int) -> dict[str, bytes]:
    """The served dashboard, light and dark, on a demo run whose last attempt (3) trains."""
    with tempfile.TemporaryDirectory(prefix="ckptdash-screenshot-") as tmp:
        os.chdir(tmp)  # paths then read runs/…, as on a login node, not /tmp/…
        run = Path("runs") / "demo"
        run.mkdir(parents=True)
        demo = threading.Thread(
            target=run_demo,
            args=(run,),
            kwargs={"steps": 900, "preempt_every_s": 6.0, "port": None},
            daemon=True,
        )
        with start_server(run) as server:
            demo.start()
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.goto(server.url)
            page.get_by_text("attempt 3 is training").wait_for(timeout=300_000)
            _wait(8.0)  # some steps into the last attempt: its band and progress line show
            pngs = {"dashboard": _whole_page(page, width)}
            page.close()
            dark = browser.new_page(viewport={"width": width, "height": 900}, color_scheme="dark")
            dark.goto(server.url)
            dark.wait_for_url("**theme=dark**", timeout=30_000)  # it follows the system
            dark.get_by_text("attempt 3 is training").wait_for(timeout=60_000)
            pngs["dashboard-dark"] = _whole_page(dark, width)
            dark.close()
            demo.join(timeout=300)
        os.chdir(ROOT)
    return pngs


def _whole_page(page: Any, width: int) -> bytes:
    """The whole page once its table and plots are drawn, only as wide as the window."""
    page.locator(".tabulator-row").first.wait_for(timeout=30_000)
    page.locator("canvas").first.wait_for(timeout=30_000)
    _wait(2.0)  # the plots' first paint
    height = page.evaluate("() => document.documentElement.scrollHeight")
    clip = {"x": 0, "y": 0, "width": width, "height": height}
    return shrink(page.screenshot(full_page=True, clip=clip))


def widget_png(browser: Any, width: int) -> bytes:
    """The quickstart's widget in JupyterLab (default settings) while cell 2 trains."""
    with tempfile.TemporaryDirectory(prefix="ckptdash-screenshot-lab-") as tmp:
        home, root = Path(tmp) / "jupyter", Path(tmp) / "root"
        root.mkdir()
        env = _lab_home(home, root)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        token = secrets.token_hex(16)
        lab = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyterlab",
                "--no-browser",
                "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={port}",
                f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={root}",
                *(["--allow-root"] if os.geteuid() == 0 else []),
            ],
            env=env,
            cwd=root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_for_lab(url, token)
            page = browser.new_page(viewport={"width": width, "height": 1450})
            page.goto(f"{url}/lab/tree/quickstart.ipynb?reset&token={token}")
            expect(page.get_by_text(f"{KERNEL} | Idle")).to_be_visible(timeout=120_000)
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
            cells = page.locator(".jp-Notebook .jp-CodeCell")
            expect(cells.nth(1).locator(".jp-InputPrompt")).to_contain_text("*", timeout=60_000)
            widget = cells.nth(0).locator(".jp-OutputArea")
            # A few periodic saves in, while the cell still trains.
            expect(widget.locator(".tabulator-row")).to_have_count(3, timeout=120_000)
            cells.nth(0).evaluate("cell => cell.scrollIntoView({block: 'start'})")
            png = shrink(page.screenshot())
            page.close()
        finally:
            os.killpg(lab.pid, signal.SIGTERM)
            lab.wait(30)
    return png


def _lab_home(home: Path, root: Path) -> dict[str, str]:
    """A kernel running this interpreter, offline Jupyter settings, the quickstart."""
    env = offline_jupyter_home(home, KERNEL, ROOT)
    # No "get notified about Jupyter news?" toast over the picture.
    notification = home / "settings" / "@jupyterlab" / "apputils-extension"
    notification.mkdir(parents=True)
    notification.joinpath("notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    nb = json.loads((ROOT / "notebooks" / "quickstart.ipynb").read_text())
    nb["metadata"]["kernelspec"] = {"name": KERNEL, "display_name": KERNEL, "language": "python"}
    (root / "quickstart.ipynb").write_text(json.dumps(nb))
    return {**env, "CKPTDASH_QUICKSTART_STEPS": "600"}


def _wait_for_lab(url: str, token: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        request = urllib.request.Request(
            f"{url}/api/status", headers={"Authorization": f"token {token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=5):
                return
        except OSError:
            _wait(0.3)
    raise RuntimeError(f"JupyterLab did not start at {url} within {timeout} s")


def _wait(seconds: float) -> None:
    threading.Event().wait(seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=("dashboard", "widget"))
    parser.add_argument("--width", type=int, default=1400)
    args = parser.parse_args(argv)
    wanted = [args.only] if args.only else ["dashboard", "widget"]
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            for wanted_name in wanted:
                if wanted_name == "dashboard":
                    pngs = dashboard_pngs(browser, args.width)
                else:
                    pngs = {"widget": widget_png(browser, args.width)}
                for name, png in pngs.items():
                    out = ROOT / "assets" / f"{name}.png"
                    out.write_bytes(png)
                    print(f"wrote {out} ({len(png) / 1024:.0f} KB)", flush=True)
        finally:
            browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
