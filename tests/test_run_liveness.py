"""What status, health and watch say about a run whose process died, or that has not started
yet (issue 23, points 5 and 6), with real training processes and the real CLI."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import ckptdash
from ckptdash.cli import main as cli_main
from ckptdash.dash.feed.follow import RunFollower
from ckptdash.dash.model import DashModel, run_status
from ckptdash.dash.views import render_header
from ckptdash.dash.views.health import alerts_of
from ckptdash.events import RunStarted
from ckptdash.ops import liveness
from ckptdash.rundir import RunDir
from ckptdash.rundir.writer import EventWriter
from ckptdash.state.reading import load_state

CLI = [sys.executable, "-m", "ckptdash"]


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)  # a poll interval, not a synchronisation


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run the ``ckptdash`` command line in this process (no interpreter start-up per call)."""
    capsys.readouterr()
    assert cli_main(list(args)) == 0
    return capsys.readouterr().out


def test_a_killed_process_is_shown_lost_at_once_by_status_and_health(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``kill -9`` of a training process on this host: ``ckptdash status`` says ``lost`` and
    ``ckptdash health`` raises ``lost`` right away (its pid is gone), instead of ``running``
    with no alert for minutes."""
    run = tmp_path / "run"
    script = textwrap.dedent(
        f"""
        import time, ckptdash
        with ckptdash.Monitor({str(run)!r}, heartbeat_interval_s=0.1) as monitor:
            step = 0
            while True:
                monitor.step(step)
                step += 1
                time.sleep(0.01)  # a training step
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.DEVNULL)
    try:

        def running() -> bool:
            if not (run / "events").is_dir():
                return False
            a = load_state(run).attempts.get(0)
            return a is not None and a.pid == child.pid and (a.step or 0) > 0

        wait_until(running, 60, "the training process to start and step")
        assert "running" in attempt_line(cli(capsys, "status", str(run), "--no-scheduler"))
        follower = RunFollower(run, refresh_s=0.5).start()  # the dashboard, open before the kill
        follower.wait_loaded(30)
        assert dashboard_word(follower) == "running"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    try:
        # The dashboard says it too, without a new event: its header badge and health banner.
        wait_until(lambda: dashboard_word(follower) == "lost", 5, "the dashboard to say lost")
        snap = follower.latest.runs[0] if follower.latest else None
        assert f"process {child.pid} is gone from" in render_header_of(follower)
        assert "lost" in [a.kind for a in alerts_of(snap, time.time())]
    finally:
        follower.stop()
    t0 = time.monotonic()
    assert list(liveness.gone_here(load_state(run))) == [0]
    elapsed = time.monotonic() - t0
    status = cli(capsys, "status", str(run), "--no-scheduler")
    health = cli(capsys, "health", str(run))
    assert f"lost (process {child.pid} gone)" in attempt_line(status), status
    assert f"ALERT lost: attempt 0's process {child.pid} is gone from" in status
    assert "ALERT lost:" in health and "no alerts" not in health
    assert elapsed < 2, f"{elapsed:.2f} s from the kill to knowing"
    folder = cli(capsys, "status", str(tmp_path), "--no-scheduler")
    assert "lost" in folder.splitlines()[1], folder


def dashboard_word(follower: RunFollower) -> str:
    """The state word the dashboard's header shows for the follower's run now."""
    snap = follower.latest.runs[0] if follower.latest and follower.latest.runs else None
    return run_status(snap, time.time())[0]


def render_header_of(follower: RunFollower) -> str:
    """The dashboard header's HTML for the follower's latest snapshot."""
    model = DashModel(path=str(follower.path))
    assert follower.latest is not None
    model.publish(follower.latest)
    return render_header(model)


def attempt_line(status: str) -> str:
    """The attempts table's row of attempt 0 in ``ckptdash status`` output."""
    return next(line for line in status.splitlines() if line.startswith("0 "))


def started(run: Path, *, pid: int, host: str, t: float) -> None:
    """Record an attempt's ``run_started`` as a job with ``pid`` on ``host`` at ``t``."""
    EventWriter(RunDir(run), attempt=0, rank=0, host=host).emit(RunStarted, t=t, pid=pid)


def test_pid_reuse_and_other_hosts(tmp_path: Path) -> None:
    """A live pid that belongs to a process started after the attempt (pid reuse) counts as
    gone; a live process that was there at the start does not; an attempt of another host
    is left to its pulses (never judged by a pid of ours)."""
    here = socket.gethostname()
    now = time.time()
    reused = tmp_path / "reused"
    started(reused, pid=os.getpid(), host=here, t=now - 365 * 86400)  # we started later
    assert list(liveness.gone_here(load_state(reused))) == [0]
    alive = tmp_path / "alive"
    started(alive, pid=os.getpid(), host=here, t=now)
    assert liveness.gone_here(load_state(alive)) == {}
    elsewhere = tmp_path / "elsewhere"
    started(elsewhere, pid=2**22 + 12345, host=here + "-other", t=now)
    assert liveness.gone_here(load_state(elsewhere)) == {}
    gone = tmp_path / "gone"
    started(gone, pid=2**22 + 12345, host=here, t=now)  # above pid_max: no such process
    assert liveness.gone_here(load_state(gone)) != {}


def crash_twice(run: Path) -> None:
    """Two attempts that fail the same way before saving anything: a crash loop."""
    for _ in range(2):
        with (
            pytest.raises(RuntimeError),
            ckptdash.Monitor(run, pulse_interval_s=0, install_signals=False),
        ):
            raise RuntimeError("NCCL error 7: invalid usage")


def test_watch_waits_for_a_pending_run_and_picks_up_runs_that_appear(tmp_path: Path) -> None:
    """``ckptdash watch`` on a run directory or a folder that does not exist yet (the job is
    PENDING) waits instead of exiting 2; once the runs appear it watches them and raises
    their alerts (here ``crash_loop``)."""
    folder, single = tmp_path / "runs", tmp_path / "solo"
    logs = {p: tmp_path / f"{p.name}.log" for p in (folder, single)}
    watchers = [
        subprocess.Popen(
            [*CLI, "watch", str(p), "--interval", "0.1"],
            stdout=open(logs[p], "w"),  # noqa: SIM115 - closed with the process
            stderr=subprocess.STDOUT,
        )
        for p in (folder, single)
    ]
    try:
        for p in (folder, single):
            wait_until(lambda p=p: "waiting for them" in logs[p].read_text(), 60, "waiting")
        assert all(w.poll() is None for w in watchers)
        crash_twice(folder / "exp1")
        crash_twice(single)
        for p, run in ((folder, folder / "exp1"), (single, single)):
            wait_until(
                lambda p=p: "crash_loop raised" in logs[p].read_text(), 60, f"{p}'s crash loop"
            )
            assert f"watching {run}" in logs[p].read_text()
    finally:
        for w in watchers:
            w.terminate()
            w.wait(timeout=30)
