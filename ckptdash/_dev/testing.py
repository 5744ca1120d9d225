"""Helpers for testing the dashboard, shipped for the tests, the benchmarks and the screenshot.

* :func:`launch_chromium` starts the system's chromium (Debian's package) with
  Playwright — never a downloaded browser.
* :func:`page_text` reads a page's text through Panel's shadow roots.
* :class:`FakeTrainer` plays the training side of the control channel: it
  claims commands, saves a small checkpoint for Save now and answers through
  the event log, exactly as a real job's rank 0 does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Final

from ckptdash import control
from ckptdash import events as ev
from ckptdash.rundir import RunDir, atomic_write
from ckptdash.rundir.writer import EventWriter

CHROMIUM_ARGS: Final = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
HOW_TO_GET_CHROMIUM: Final = "install the system browser: sudo apt-get install chromium"

# Text of every element, shadow roots included (Panel renders each component in one).
_PAGE_TEXT_JS: Final = """() => {
  const out = [];
  const walk = (node) => {
    if (node.nodeType === Node.TEXT_NODE) { out.push(node.textContent); return; }
    if (["STYLE", "SCRIPT", "TEMPLATE"].includes(node.nodeName)) return;
    if (node.shadowRoot) walk(node.shadowRoot);
    for (const child of node.childNodes) walk(child);
  };
  walk(document.body);
  return out.join(" ");
}"""


def chromium_path() -> str | None:
    """The system chromium (``$CKPTDASH_CHROMIUM`` first), or None when there is none."""
    for candidate in (os.environ.get("CKPTDASH_CHROMIUM"), shutil.which("chromium")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    default = "/usr/bin/chromium"
    return default if os.access(default, os.X_OK) else None


def require_chromium() -> None:
    """Skip the calling test module (or fixture) when there is no chromium, saying how to
    install it; with CI=true raise instead: the browser tests must run there."""
    if chromium_path() is not None:
        return
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"CI=true but no chromium: {HOW_TO_GET_CHROMIUM}")
    import pytest

    pytest.skip(f"no chromium; {HOW_TO_GET_CHROMIUM}", allow_module_level=True)


PAGE_TIMEOUT_MS: Final = 120_000
"""Playwright's bound for a navigation or an action (its default: 30 s). Two CI-like runs with
a CPU-bound process beside the suite saw a first ``page.goto`` of a served dashboard take
longer than 30 s; the bound is for a page that never loads, not a window a slow one must fit."""
EXPECT_TIMEOUT_MS: Final = 30_000
"""The same for an ``expect(...)`` without a timeout of its own (Playwright's default: 5 s)."""


class _PatientBrowser:
    """A launched browser whose new contexts and pages take :data:`PAGE_TIMEOUT_MS`."""

    def __init__(self, browser: Any) -> None:
        self._browser = browser

    def new_context(self, **options: Any) -> Any:
        context = self._browser.new_context(**options)
        context.set_default_timeout(PAGE_TIMEOUT_MS)
        return context

    def new_page(self, **options: Any) -> Any:
        page = self._browser.new_page(**options)
        page.set_default_timeout(PAGE_TIMEOUT_MS)
        return page

    def __getattr__(self, name: str) -> Any:
        return getattr(self._browser, name)


def launch_chromium(playwright: Any) -> Any:
    """A headless chromium browser driven by ``playwright`` (sync API), patient with a loaded
    machine (:data:`PAGE_TIMEOUT_MS`, :data:`EXPECT_TIMEOUT_MS`)."""
    from playwright.sync_api import expect

    path = chromium_path()
    if path is None:
        raise RuntimeError(f"no chromium found; {HOW_TO_GET_CHROMIUM}")
    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    return _PatientBrowser(playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS))


def offline_jupyter_home(home: Path, kernel: str, pythonpath: Path) -> dict[str, str]:
    """A Jupyter set-up of its own under ``home``, for a JupyterLab the tests or the screenshot
    script start: a kernel ``kernel`` running this interpreter (the venv's own ``python3``
    kernelspec starts whichever ``python`` is first on PATH), no news feed, update check or
    extension manager (each would fetch from the internet), and nothing from the user's own
    Jupyter. Returns the environment to start JupyterLab with; settings go under
    ``home / "settings"``."""
    spec = home / "path" / "kernels" / kernel
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec.joinpath("kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": kernel, "language": "python"})
    )
    config = home / "config"
    config.mkdir()
    lab_app = {
        "news_url": None,
        "check_for_updates_class": "jupyterlab.NeverCheckForUpdate",
        "extension_manager": "readonly",
    }
    config.joinpath("jupyter_server_config.json").write_text(json.dumps({"LabApp": lab_app}))
    env = {k: v for k, v in os.environ.items() if k != "JUPYTER_TOKEN"}
    env.update(
        JUPYTER_PATH=str(home / "path"),
        JUPYTER_CONFIG_DIR=str(config),
        JUPYTER_DATA_DIR=str(home / "data"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
        PYTHONPATH=str(pythonpath),
    )
    return env


def page_text(page: Any) -> str:
    """All text on the page, including what Panel renders inside shadow roots."""
    return str(page.evaluate(_PAGE_TEXT_JS))


class ServeProcess:
    """``ckptdash serve PATH --port 0 [ARGS]`` as a user runs it, in its own process.

    >>> with ServeProcess("runs/exp1") as server:      # doctest: +SKIP
    ...     page.goto(server.url)
    """

    def __init__(self, path: str | os.PathLike[str], *args: str, timeout: float = 60.0) -> None:
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in stop()
            "w+", prefix="ckptdash-serve-", suffix=".log"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ckptdash", "serve", str(path), "--port", "0", *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.url = self._wait_for_url(timeout)

    def _wait_for_url(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        pause = threading.Event()  # never set: a short pause between looks at the log
        while time.monotonic() < deadline:
            found = re.search(r"at (https?://\S+)", self.log())
            if found:
                return found.group(1)
            if self.proc.poll() is not None:
                break
            pause.wait(0.02)
        printed = self.log()  # read before stop() removes the log
        self.stop()
        raise RuntimeError(f"ckptdash serve did not start:\n{printed}")

    def log(self) -> str:
        """What the server printed so far."""
        with open(self._log.name) as f:
            return f.read()

    def rss_bytes(self, peak: bool = False) -> int:
        """The server's resident memory now (or its peak), from /proc."""
        field = "VmHWM" if peak else "VmRSS"
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"no {field} in /proc/{self.proc.pid}/status")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)
        self._log.close()

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class FakeTrainer:
    """The training side of the control channel, without training.

    :meth:`answer` claims every command in the inbox and answers it as rank 0
    would: ``command_received``, then for ``save_now`` a small checkpoint
    (trigger ``manual``) and ``command_applied`` with its path; for
    ``stop_after_save`` the same and ``run_finished``; malformed files are
    rejected.
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, attempt: int = 0) -> None:
        self.run = RunDir(run_dir)
        self.writer = EventWriter(self.run, attempt=attempt, host="fake-node")
        self.step = 0

    def start(self, **fields: Any) -> None:
        """Write ``run_started`` (scheduler ``local`` unless given)."""
        self.writer.emit(ev.RunStarted, **{"scheduler": "local", **fields})

    def heartbeat(self, step: int, **fields: Any) -> None:
        self.step = step
        self.writer.emit(ev.Heartbeat, step=step, **fields)

    def save(self, step: int, trigger: ev.Trigger = "periodic", name: str | None = None) -> str:
        """Write a small checkpoint atomically and record it; returns its path."""
        self.step = step
        path = self.run.checkpoints / (name or f"step={step}-{trigger}.ckpt")
        path.parent.mkdir(parents=True, exist_ok=True)
        result = atomic_write(path, f"checkpoint at step {step}\n".encode(), fsync=False)
        self.writer.emit(
            ev.CheckpointSaved,
            step=step,
            path=str(path),
            trigger=trigger,
            size_bytes=result.size_bytes,
            duration_s=0.01,
            checksum=result.checksum,
        )
        return str(path)

    def answer(self) -> list[str]:
        """Answer every pending command; returns the ids answered."""
        done = []
        for claimed in control.claim(self.run):
            name = claimed.command_name
            self.writer.emit(
                ev.CommandReceived, step=self.step, command_id=claimed.id, command=name
            )
            if claimed.error is not None:
                self.writer.emit(
                    ev.CommandRejected, step=self.step, command_id=claimed.id, reason=claimed.error
                )
            else:
                self.step += 1
                path = self.save(self.step, "manual")
                self.writer.emit(
                    ev.CommandApplied,
                    step=self.step,
                    command_id=claimed.id,
                    command=name,
                    detail=path,
                )
                if name == "stop_after_save":
                    self.writer.emit(ev.RunFinished, step=self.step, reason="stopped by command")
            control.complete(self.run, claimed)
            done.append(claimed.id)
        return done

    def close(self) -> None:
        self.writer.close()

    def __enter__(self) -> FakeTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
