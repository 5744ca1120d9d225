"""Refresh ``assets/dashboard.png``: the dashboard on a realistic run, as the README shows it.

    .venv/bin/python scripts/screenshot.py [--out assets/dashboard.png] [--width 1400]

The run is :func:`ckptdash.dash.sample.write_sample_run` (three hours of a SLURM
job: a preemption with a signal save and a requeue, a manual save, a kill
without warning, a resume), served by ``start_server`` and photographed by the
system chromium. The PNG is reduced to a 256-colour palette when Pillow is
installed, to keep it small (the goal is < 300 KB).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from ckptdash.dash.app import start_server
from ckptdash.dash.sample import write_sample_run
from ckptdash.dash.testing import launch_chromium

ROOT = Path(__file__).resolve().parent.parent


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "assets" / "dashboard.png")
    parser.add_argument("--width", type=int, default=1400)
    args = parser.parse_args(argv)
    out = args.out.resolve()
    with tempfile.TemporaryDirectory(prefix="ckptdash-screenshot-") as tmp:
        os.chdir(tmp)  # paths then read runs/…, as on a login node, not /tmp/…
        run = write_sample_run(Path("runs") / "resnet50-imagenet")
        with start_server(run.root) as server, sync_playwright() as p:
            browser = launch_chromium(p)
            page = browser.new_page(viewport={"width": args.width, "height": 900})
            page.goto(server.url)
            page.get_by_text("attempt 2 is training").wait_for(timeout=30_000)
            page.locator(".tabulator-row").first.wait_for(timeout=30_000)
            page.locator("canvas").first.wait_for(timeout=30_000)
            page.wait_for_load_state("networkidle")
            # The plot draws on the next animation frames after its data arrive.
            page.evaluate("() => new Promise(r => setTimeout(r, 500))")
            png = shrink(page.screenshot(full_page=True))
            browser.close()
        os.chdir(ROOT)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(png)
    print(f"wrote {out} ({len(png) / 1024:.0f} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
