"""What the dashboard says about a real job after the first hour: a killed attempt's lost
steps and a Ctrl-C'd attempt in the events feed, newest first; the same word for the run in
the header and in `ckptdash status`; Save now and Stop off, with the reason, once nothing
runs; a 0-based loop that ends at its last step; the line of a page that waits for its run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ckptdash import humanize
from ckptdash.cli import main
from ckptdash.dash.app import Dashboard, DashOptions
from ckptdash.dash.feed.hub import FollowerHub
from ckptdash.dash.views.events import feed_entries
from ckptdash.dash.views.timeline import clock_ticks
from ckptdash.state.reading import load_state
from tests.train.helpers import train_loop

WaitUntil = Callable[..., None]
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}

# A plain-PyTorch job that saves every 10 steps (20 ms a step) and resumes from the rule's
# choice: the README's loop.
JOB = textwrap.dedent(
    """
    import sys, threading, torch, ckptdash
    model = torch.nn.Linear(4, 1)
    step_time = threading.Event()  # never set: each step takes 20 ms, like real work
    with ckptdash.Monitor(sys.argv[1], max_steps=100_000, poll_interval_s=0.01,
                          agree_interval_s=0.001) as monitor:
        state = monitor.load()
        start = state["step"] + 1 if state else 0
        for step in range(start, 100_000):
            step_time.wait(0.02)
            monitor.step(step, loss=1.0)
            if monitor.should_save:
                monitor.save({"model": model.state_dict(), "step": step})
            elif step % 10 == 0:
                monitor.save({"model": model.state_dict(), "step": step}, trigger="periodic")
            if monitor.should_stop:
                break
    """
)


def _attempt_until(run: Path, attempt: int, step: int, end: signal.Signals) -> None:
    """Start the job as attempt ``attempt``, let it train past ``step``, then send it ``end``;
    wait for its exit."""
    job = subprocess.Popen([sys.executable, "-c", JOB, str(run)], env=ENV)

    def past() -> bool:
        a = load_state(run).attempts.get(attempt) if run.is_dir() else None
        return a is not None and (a.step or 0) >= step

    try:
        # Each look replays the log: a look every 50 ms leaves the CPU to the job.
        deadline = time.monotonic() + 90
        pause = threading.Event()  # never set: an interruptible pause between looks
        while not past():
            assert time.monotonic() < deadline, f"attempt {attempt} never passed step {step}"
            assert job.poll() is None, f"the job ended early (exit {job.returncode})"
            pause.wait(0.05)
        job.send_signal(end)
        job.wait(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


@pytest.fixture(scope="module")
def killed_then_interrupted(
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """A run in a folder: attempt 0 killed without warning (SIGKILL) past step 25, attempt 1
    resumed and ended with Ctrl-C's signal (SIGTERM) past step 45."""
    run = tmp_path_factory.mktemp("second-hour") / "runs" / "exp1"
    _attempt_until(run, 0, 25, signal.SIGKILL)
    _attempt_until(run, 1, 45, signal.SIGTERM)
    return run


@pytest.fixture
def dash(
    killed_then_interrupted: Path, hub: FollowerHub, wait_until: WaitUntil
) -> Iterator[Dashboard]:
    d = Dashboard(killed_then_interrupted, options=DashOptions(watch="inotify"), hub=hub)
    wait_until(lambda: d.model.run is not None, what="the first load")
    with d.holding_updates():
        pass
    yield d
    d.close()


def test_the_feed_tells_what_happened_to_each_attempt_newest_first(dash: Dashboard) -> None:
    """The feed says, newest first: attempt 1 stopped (terminated) after its signal save on
    SIGTERM; it had resumed from the checkpoint attempt 0 saved last; attempt 0 was killed
    without warning and lost the steps since that checkpoint (a number, and the step)."""
    snap = dash.model.run
    assert snap is not None
    texts = [e.text for e in feed_entries(snap)]
    killed, resumed = snap.attempts[0], snap.attempts[1]
    assert resumed.resumed_from is not None
    base = next(c for c in snap.checkpoints if c.path == resumed.resumed_from)
    assert killed.step is not None and base.step is not None
    lost = f"{killed.step - base.step} steps lost since its checkpoint at step {base.step}"

    def at(pattern: str) -> int:
        return next(i for i, t in enumerate(texts) if re.search(pattern, t))

    order = [
        at(r"^attempt 1 stopped at step \d+ \(terminated\)$"),
        at(r"^attempt 1 saved checkpoints/step=\d+\.ckpt \(signal\)"),
        at(r"^attempt 1 got SIGTERM at step \d+"),
        at(rf"^attempt 1 resumed from checkpoints/step={base.step}\.ckpt \(step {base.step}\)"),
        at(rf"^attempt 0 went silent at step {killed.step} .*killed without warning.*: {lost}$"),
        at(r"^attempt 0 started from scratch"),
    ]
    assert order == sorted(order), texts
    assert "What happened" in dash.feed._pane.object
    assert lost in dash.feed._pane.object


def test_header_and_cli_name_the_interrupted_run_alike_and_controls_say_why_off(
    dash: Dashboard, killed_then_interrupted: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After Ctrl-C (SIGTERM, no requeue) the header's badge and `ckptdash status FOLDER` say
    the same word, "terminated"; Save now and Stop are off, saying no attempt is running;
    sizes read in binary units (KiB) in the CLI, as in the dashboard's table."""
    header = dash.header._pane.object
    assert re.search(r'class="badge"[^>]*>terminated<', header)
    assert main(["status", str(killed_then_interrupted.parent), "--no-scheduler"]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line.split()[:2] == ["exp1", "terminated"]
    controls = dash.controls
    assert controls.save_button.disabled and controls.stop_button.disabled
    assert "terminated and not requeued: no attempt is running" in controls.off_reason.object
    assert main(["status", str(killed_then_interrupted), "--no-scheduler"]) == 0
    assert re.search(r"\s\d+ B\s|\s\d+\.\d KiB\s", capsys.readouterr().out)


def test_a_zero_based_loop_that_finished_reads_all_steps_done(
    tmp_path: Path,
    hub: FollowerHub,
    wait_until: WaitUntil,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`for step in range(30)` with max_steps=30 ends at step index 29: once it finished, the
    header and `ckptdash status FOLDER` read 30 / 30, not 29 / 30."""
    run = tmp_path / "runs" / "zero"
    train_loop(run, total_steps=30)
    assert main(["status", str(run.parent), "--no-scheduler"]) == 0
    assert "30 / 30" in capsys.readouterr().out
    d = Dashboard(run, options=DashOptions(watch="inotify"), hub=hub)
    try:
        wait_until(lambda: d.model.run is not None, what="the first load")
        with d.holding_updates():
            html = d.header._pane.object
        assert "finished" in html and ">30 <span class='muted'>/ 30</span>" in html
    finally:
        d.close()


def test_a_page_waiting_for_its_run_says_so(
    tmp_path: Path, hub: FollowerHub, wait_until: WaitUntil
) -> None:
    """A dashboard opened before the training started says Save now and Stop wait for the run
    to start, not that no run is selected."""
    d = Dashboard(tmp_path / "not-yet", options=DashOptions(watch="poll"), hub=hub)
    try:
        wait_until(lambda: d.model.loaded, what="the first read")
        with d.holding_updates():
            d.controls._render()
        assert "waiting for the run to start" in d.controls.off_reason.object
        assert "no run is selected" not in d.controls.off_reason.object
    finally:
        d.close()


def test_time_ticks_are_clock_times_at_every_zoom() -> None:
    """The timeline's x axis reads wall-clock times even on the first seconds of a run, where
    Bokeh's default reads "0ms", "500ms" (durations, not times)."""
    ticks = clock_ticks()
    for zoom in ("milliseconds", "seconds", "minsec", "minutes", "hourmin", "hours"):
        assert getattr(ticks, zoom).startswith("%H:%M"), zoom
    assert (
        humanize.size(21_400) == "20.9 KiB" and humanize.short_id("00000001-3f2a91c0") == "3f2a91c0"
    )
