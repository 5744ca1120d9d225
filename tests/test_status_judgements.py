"""``ckptdash status --json`` carries every judgement its text shows (issue 32, point 11): on
the same runs — one whose training process was ``kill -9``'d on this host, one silent for an
hour, one restarted fresh after a model change — the JSON says ``lost``, ``stale`` and
``before fresh start`` wherever the text does, never ``running`` where a person reads
``lost``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ckptdash import events
from ckptdash.cli import main
from ckptdash.rundir.writer import EventWriter
from ckptdash.state.reading import load_state

pytestmark = pytest.mark.process  # a real training process, killed with SIGKILL

WaitUntil = Callable[..., None]


def _killed(run: Path, wait_until: WaitUntil) -> int:
    """A plain-loop Monitor training in a child process on this host, then ``kill -9``'d."""
    script = textwrap.dedent(
        f"""
        import threading, ckptdash
        with ckptdash.Monitor({str(run)!r}, heartbeat_interval_s=0.1) as monitor:
            step, pause = 0, threading.Event()
            while True:
                monitor.step(step)
                step += 1
                pause.wait(0.01)  # a training step
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.DEVNULL)
    try:

        def stepping() -> bool:
            a = load_state(run).attempts.get(0) if (run / "events").is_dir() else None
            return a is not None and a.pid == child.pid and (a.step or 0) > 0

        wait_until(stepping, 60, "the training process to step")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    return child.pid


def _silent(run: Path) -> None:
    """A running attempt (this live process) whose last heartbeat is an hour old."""
    hour_ago = time.time() - 3600
    with EventWriter(run, attempt=0) as w:
        w.emit(events.RunStarted, t=hour_ago - 10, max_steps=100)
        w.emit(events.Heartbeat, t=hour_ago, step=5)


def _fresh(run: Path) -> str:
    """Attempt 0 saved a checkpoint; attempt 1 started fresh (a changed model)."""
    ckpt = run / "checkpoints" / "step=8.ckpt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"x" * 10)
    with EventWriter(run, attempt=0) as w:
        w.emit(events.RunStarted, max_steps=10)
        w.emit(
            events.CheckpointSaved,
            step=8,
            path=str(ckpt),
            trigger="periodic",
            size_bytes=10,
            duration_s=0.1,
        )
        w.emit(events.RunFinished, step=8, reason="completed")
    with EventWriter(run, attempt=1) as w:
        w.emit(events.RunStarted, max_steps=10, fresh="model-v2")
        w.emit(events.RunFinished, step=10, reason="completed")
    return str(ckpt)


def _status(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    assert main(["status", *args, "--no-scheduler"]) == 0
    return capsys.readouterr().out


def test_status_json_says_what_the_text_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], wait_until: WaitUntil
) -> None:
    """Run by run, the JSON's ``state`` is the word of the folder's text line; the killed
    run's attempt is ``lost`` with the line the text prints (its recorded ``outcome`` stays
    ``running``, as the log says); the fresh run's old checkpoint is ``before_fresh_start``
    where the text says so, and ``next_resume`` is the text's ``next resume`` line."""
    folder = tmp_path / "runs"
    pid = _killed(folder / "killed", wait_until)
    _silent(folder / "silent")
    old = _fresh(folder / "fresh")

    lines = _status(capsys, str(folder)).splitlines()
    words = {ln.split()[0]: ln.split()[1] for ln in lines[1:4]}
    listed = json.loads(_status(capsys, str(folder), "--json"))["runs"]
    assert {Path(r["root"]).name: r["state"] for r in listed} == words
    assert words == {"killed": "lost", "silent": "stale", "fresh": "finished"}

    text = _status(capsys, str(folder / "killed"))
    one = json.loads(_status(capsys, str(folder / "killed"), "--json"))
    assert f"lost (process {pid} gone)" in text
    attempt = one["attempts"]["0"]
    assert (attempt["outcome"], attempt["shown_outcome"]) == ("running", "lost")
    assert f"process {pid} is gone" in attempt["lost"]
    assert one["state"] == "lost"

    text = _status(capsys, str(folder / "fresh"))
    one = json.loads(_status(capsys, str(folder / "fresh"), "--json"))
    assert "(before fresh start)" in text
    assert one["checkpoints"][old]["before_fresh_start"] is True
    assert f"next resume: fresh start  ({one['next_resume']['reason']})" in text
    assert one["next_resume"]["path"] is None
