"""The dashboard in a real browser: event → DOM latency, and a big folder's first render and memory.

(a) Latency: a ``checkpoint_saved`` is appended to a run served by ``ckptdash serve``
while a writer adds heartbeats at 2 Hz; the time until its row is in the page's DOM
(found by a 5 ms poll inside the page, through Panel's shadow roots) is measured for
each event, with inotify against polling (``--poll``, 1 s). Writer and browser share
one clock. Goal: p95 ≤ 300 ms with inotify.

(c) Wide: a 1,024-rank × 1 h run in the documented format (``--wide``: only this), first
render and event → DOM p95 against an 8-rank × 1 h run.

(d) Folder of 1,000 runs (``--folder-1000``: only this): 1,000 runs of 8 ranks × 15 min in
the documented format, as a group's folder holds them (10 live, the others ended 1 to 11 h
ago), against a folder of one live such run: first render, every run listed, and the
server's memory. Goal (issue 24): under 300 MB.

(b) Scale: a folder of 100 sample runs and one 1,000,000-event run (the ingest
benchmark's log: heartbeats with metrics and a checkpoint every 1000 events), against a
folder with one small run: time from navigation to the page (first render), to the run
list holding every run, to the big run's detail shown after clicking it, and the server
process's memory.

The server is a separate ``ckptdash serve`` process, started as a user would.
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ingest import make_run
from timing import Row

from ckptdash import events
from ckptdash._dev.sample import write_sample_run
from ckptdash._dev.scale_runs import write_run
from ckptdash._dev.testing import (
    HOW_TO_GET_CHROMIUM,
    ServeProcess,
    chromium_path,
    launch_chromium,
)
from ckptdash.rundir.writer import EventWriter

GOAL_P95_S = 0.300

# Arms a watch for `marker` in the tables (inside Panel's shadow roots); records Date.now()
# when it appears. Polls every 5 ms, looking for the tables again only every 100 ms: the
# page's own work must not wait behind the measurement.
_ARM_JS = """(marker) => {
  window.__seen = window.__seen || {};
  const find = () => {
    const found = [];
    const walk = (node) => {
      if (node.shadowRoot) {
        found.push(...node.shadowRoot.querySelectorAll('.tabulator-tableholder'));
        walk(node.shadowRoot);
      }
      for (const child of node.children || []) walk(child);
    };
    walk(document.body);
    return found;
  };
  let tables = find(), checks = 0;
  const check = () => {
    if (++checks % 20 === 0) tables = find();
    if (tables.some(t => t.textContent.includes(marker))) window.__seen[marker] = Date.now();
    else setTimeout(check, 5);
  };
  check();
}"""


@contextmanager
def _browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            yield browser
        finally:
            browser.close()


def _open(browser: Any, url: str) -> Any:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    page.get_by_role("button", name="Save now").wait_for(timeout=60_000)
    page.locator(".tabulator-tableholder").last.wait_for(state="attached", timeout=60_000)
    return page


class _Heartbeats:
    """A training job's heartbeats at 2 Hz, in the background."""

    def __init__(self, writer: EventWriter) -> None:
        self._writer, self._stop = writer, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.step = 0

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.step += 1
            self._writer.emit(events.Heartbeat, step=self.step, metrics={"loss": 1.0})

    def __enter__(self) -> _Heartbeats:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _latencies(browser: Any, root: Path, n: int, *serve_args: str) -> list[float]:
    """Seconds from append to DOM for ``n`` checkpoint events, on a server with these args."""
    gaps = random.Random(0)
    out = []
    with EventWriter(root, attempt=0) as w:
        w.emit(events.RunStarted, scheduler="local", max_steps=10**6)
        with ServeProcess(root, *serve_args) as server, _Heartbeats(w):
            page = _open(browser, server.url)
            for i in range(n + 3):  # the first three warm up
                marker = f"bench-{root.name}-{i}.ckpt"
                page.evaluate(_ARM_JS, marker)
                appended = time.time()
                w.emit(
                    events.CheckpointSaved,
                    step=i,
                    path=str(root / "checkpoints" / marker),
                    trigger="periodic",
                    size_bytes=1,
                    duration_s=0.01,
                )
                page.wait_for_function("(m) => window.__seen[m]", arg=marker, timeout=30_000)
                seen_ms = page.evaluate("(m) => window.__seen[m]", marker)
                if i >= 3:
                    out.append(seen_ms / 1000 - appended)
                # A random gap as long as the poll interval: events land at every phase of it.
                page.wait_for_timeout(gaps.uniform(50, 1050))
            page.close()
    return out


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def latency_rows(browser: Any, quick: bool) -> list[Row]:
    n = 20 if quick else 60
    with tempfile.TemporaryDirectory(prefix="ckptdash-bench-latency-") as tmp:
        fast = _latencies(browser, Path(tmp, "inotify"), n)
        slow = _latencies(browser, Path(tmp, "poll"), n, "--poll")
    p50, p95 = _pct(fast, 0.5), _pct(fast, 0.95)
    b50, b95 = _pct(slow, 0.5), _pct(slow, 0.95)
    return [
        Row(
            f"dashboard: checkpoint appended → row in the browser DOM, inotify, p50 / p95 ms"
            f" ({n} events, heartbeats at 2 Hz; max {max(fast) * 1000:.0f} ms)",
            f"{p50 * 1000:.0f} / {p95 * 1000:.0f} ms",
            f"{b50 * 1000:.0f} / {b95 * 1000:.0f} ms (--poll, 1 s)",
            p95 / b95,
            f"p95 ≤ {GOAL_P95_S * 1000:.0f} ms",
            p95 <= GOAL_P95_S,
        )
    ]


def _scale(browser: Any, folder: Path, big: tuple[str, int] | None) -> dict[str, float]:
    """Seconds to first render, to every run listed, to the big run shown; memory in MB.

    ``big`` names the big run and its event count (its last checkpoint is at step n - 1).
    """
    runs = len([p for p in folder.iterdir() if (p / "events").is_dir()])
    out: dict[str, float] = {}
    with ServeProcess(folder) as server:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        start = time.perf_counter()
        page.goto(server.url)
        page.get_by_role("button", name="Save now").wait_for(timeout=120_000)
        out["render"] = time.perf_counter() - start
        listed = page.get_by_text(f"Runs ({runs})") if runs > 1 else page.get_by_text("events")
        listed.first.wait_for(timeout=120_000)
        out["listed"] = time.perf_counter() - start
        if big is not None:
            name, n = big
            begin = time.perf_counter()
            page.locator(".tabulator-row", has_text=name).first.click()
            page.get_by_text(f"{n:,} events").first.wait_for(timeout=120_000)
            page.locator(".tabulator-row", has_text=f"step={n - 1}.ckpt").first.wait_for(
                timeout=60_000
            )
            out["detail"] = time.perf_counter() - begin
        out["rss_mb"] = server.rss_bytes() / 2**20
        out["peak_mb"] = server.rss_bytes(peak=True) / 2**20
        page.close()
    return out


def _seconds_row(
    metric: str, key: str, big: dict[str, float], small: dict[str, float], baseline: str
) -> Row:
    """Seconds ``key`` of :func:`_scale` for the big case against the small one's."""
    return Row(
        metric, f"{big[key]:.2f} s", f"{small[key]:.2f} s ({baseline})", big[key] / small[key]
    )


def _memory_row(
    label: str,
    big: dict[str, float],
    small: dict[str, float],
    baseline: str,
    goal_mb: float | None = None,
) -> Row:
    """The server's memory after load (and its peak) for the big case against the small one's."""
    goal = {} if goal_mb is None else {"goal": f"< {goal_mb:.0f} MB (issue 24)"}
    return Row(
        f"dashboard server memory after load, {label}, MB (peak)",
        f"{big['rss_mb']:.0f} MB ({big['peak_mb']:.0f})",
        f"{small['rss_mb']:.0f} MB ({small['peak_mb']:.0f}) ({baseline})",
        big["rss_mb"] / small["rss_mb"],
        **goal,
        met=None if goal_mb is None else big["rss_mb"] < goal_mb,
    )


def scale_rows(browser: Any, quick: bool) -> list[Row]:
    n_runs, n_events = (20, 200_000) if quick else (100, 1_000_000)
    with tempfile.TemporaryDirectory(prefix="ckptdash-bench-scale-") as tmp:
        folder, small = Path(tmp, "many"), Path(tmp, "one")
        now = time.time()
        for i in range(n_runs):
            write_sample_run(folder / f"run-{i:03d}", now=now - 3600 * (i + 1), heartbeat_s=60)
        make_run(folder / "huge", n_events)
        write_sample_run(small / "run-000", now=now - 3600, heartbeat_s=60)
        many = _scale(browser, folder, ("huge", n_events))
        one = _scale(browser, small, None)
    label = f"{n_runs} runs + one {n_events:,}-event run"
    return [
        _seconds_row(
            f"dashboard first render (page usable), {label}, s",
            "render",
            many,
            one,
            "one small run",
        ),
        _seconds_row(
            f"dashboard: all {n_runs + 1} runs listed after navigation, s",
            "listed",
            many,
            one,
            "one small run shown",
        ),
        Row(
            f"dashboard: click the {n_events:,}-event run → header and its"
            f" {n_events // 1000:,}-row checkpoint table shown, s",
            f"{many['detail']:.2f} s",
            "—",
            None,
        ),
        _memory_row(label, many, one, "one small run"),
    ]


def wide_rows(browser: Any, quick: bool) -> list[Row]:
    """(c) A wide run: first render and event → DOM p95 on a 1,024-rank × 1 h run (256 with
    ``--quick``), written in the documented format, against an 8-rank × 1 h run."""
    ranks, n = (256, 20) if quick else (1024, 40)
    with tempfile.TemporaryDirectory(prefix="ckptdash-bench-wide-") as tmp:
        base, wide = Path(tmp, "base", "run"), Path(tmp, "wide", "run")
        write_run(base, ranks=8, seconds=3600)
        write_run(wide, ranks=ranks, seconds=3600)
        first = {
            name: _scale(browser, root.parent, None)
            for name, root in [("base", base), ("wide", wide)]
        }
        lat = {"base": _latencies(browser, base, n), "wide": _latencies(browser, wide, n)}
    p95 = {k: _pct(v, 0.95) for k, v in lat.items()}
    return [
        _seconds_row(
            f"dashboard first render (page usable), {ranks:,} ranks × 1 h, s",
            "render",
            first["wide"],
            first["base"],
            "8 ranks × 1 h",
        ),
        Row(
            f"dashboard: checkpoint appended → row in the DOM, {ranks:,} ranks × 1 h, inotify,"
            f" p95 ms ({n} events)",
            f"{p95['wide'] * 1000:.0f} ms",
            f"{p95['base'] * 1000:.0f} ms (8 ranks × 1 h)",
            p95["wide"] / p95["base"],
            f"p95 ≤ {GOAL_P95_S * 1000:.0f} ms",
            p95["wide"] <= GOAL_P95_S,
        ),
    ]


GOAL_FOLDER_MB = 300.0


def folder_rows(browser: Any, quick: bool) -> list[Row]:
    """(d) A folder of 1,000 small runs (100 with ``--quick``) against a folder of one."""
    n_runs, live = (100, 10) if quick else (1000, 10)
    now = time.time()
    with tempfile.TemporaryDirectory(prefix="ckptdash-bench-folder-") as tmp:
        many, one = Path(tmp, "many"), Path(tmp, "one")
        for i in range(n_runs):
            end = now if i < live else now - 3600 * (1 + 10 * i / n_runs)
            write_run(many / f"run-{i:04d}", ranks=8, seconds=900, end=end)
        write_run(one / "run-0000", ranks=8, seconds=900)
        big, small = _scale(browser, many, None), _scale(browser, one, None)
    label = f"{n_runs:,} runs × 8 ranks × 15 min ({live} live)"
    return [
        _seconds_row(
            f"dashboard first render (page usable), folder of {label}, s",
            "render",
            big,
            small,
            "one such run",
        ),
        _seconds_row(
            f"dashboard: all {n_runs:,} runs listed after navigation, s",
            "listed",
            big,
            small,
            "one such run",
        ),
        _memory_row(f"folder of {label}", big, small, "one such run", GOAL_FOLDER_MB),
    ]


def run(quick: bool) -> list[Row]:
    if chromium_path() is None:
        return [Row("dashboard benchmarks", f"skipped: {HOW_TO_GET_CHROMIUM}", "—", None)]
    with _browser() as browser:
        if "--wide" in sys.argv:
            return wide_rows(browser, quick)
        if "--folder-1000" in sys.argv:
            return folder_rows(browser, quick)
        return (
            latency_rows(browser, quick)
            + scale_rows(browser, quick)
            + wide_rows(browser, quick)
            + folder_rows(browser, quick)
        )


if __name__ == "__main__":
    from timing import table

    print(table(run("--quick" in sys.argv)))
