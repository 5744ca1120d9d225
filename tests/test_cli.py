"""The ckptdash command line: status as a table and as JSON, controls, and clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptdash import control, events
from ckptdash.cli import main
from ckptdash.rundir.writer import EventWriter


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run with two attempts, a signal save, a requeue, a periodic save and a bad line."""
    root = tmp_path / "exp1"
    ckpts = root / "checkpoints"
    ckpts.mkdir(parents=True)
    with EventWriter(root, attempt=0, host="node1") as w:
        w.emit(events.RunStarted, scheduler="slurm", job_id="77", max_steps=100)
        (ckpts / "a.ckpt").write_bytes(b"x" * 10)
        w.emit(
            events.CheckpointSaved,
            step=40,
            path=str(ckpts / "a.ckpt"),
            trigger="signal",
            size_bytes=10,
            duration_s=0.2,
        )
        w.emit(events.SignalReceived, step=40, signal="SIGUSR2", action="requeue")
        w.emit(events.RequeueIssued, step=40, job_id="77", command="scontrol requeue 77")
        w.emit(events.RunFinished, step=40, reason="preempted")
    with EventWriter(root, attempt=1, host="node2") as w:
        w.emit(events.RunStarted, scheduler="slurm", job_id="77", max_steps=100)
        w.emit(events.RunResumed, step=40, path=str(ckpts / "a.ckpt"), reason="newest valid")
        w.emit(events.Heartbeat, step=60, metrics={"loss": 0.1})
    with open(w.path, "ab") as f:
        f.write(b"{torn json\n")
    return root


def test_status_table_shows_attempts_checkpoints_and_bad_lines(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The table names both attempts, the signal checkpoint, the requeue and the skipped line."""
    assert main(["status", str(run)]) == 0
    out = capsys.readouterr().out
    assert "node1" in out
    assert "node2" in out
    assert "signal" in out
    assert "scontrol requeue 77" in out
    assert "skipped 1 unreadable event line(s): corrupt 1" in out
    assert "next resume:" in out


def test_status_json_is_the_run_state(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints the run state: checkpoints, attempts, requeues and bad-line counts."""
    assert main(["status", str(run), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["attempts"]) == 2
    assert len(data["checkpoints"]) == 1
    assert data["bad_lines"]["counts"] == {"corrupt": 1}
    assert data["requeues"][0]["issued"] is True


def test_status_of_a_folder_of_runs(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A parent folder lists every run below it."""
    EventWriter(run.parent / "exp2", attempt=0).close()
    assert main(["status", str(run.parent), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["runs"]) == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["status", "{tmp}/missing"], "no such directory"),
        (["status", "{tmp}/empty"], "holds no ckptdash run"),
        (["save", "{tmp}/missing"], "no such directory"),
        (["stop", "{run}"], "add --yes"),
        (["resume", "{run}", "--pin", "{tmp}/evil.ckpt"], "not a checkpoint this run recorded"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    run: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad input gets one line naming the problem and the fix, exit status 2, no traceback."""
    (run.parent / "empty").mkdir()
    args = [a.format(tmp=run.parent, run=run) for a in argv]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert err.count("\n") == 1


def test_unreadable_settings_file_is_reported(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A corrupt settings file is named with the fix, not a crash."""
    (run / "control").mkdir(exist_ok=True)
    (run / "control" / "settings.json").write_text("{oops")
    assert main(["requeue", str(run), "--suspend"]) == 2
    err = capsys.readouterr().err
    assert "settings.json" in err
    assert "Traceback" not in err


def test_controls_write_commands_and_settings(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """save/stop queue commands; requeue and resume change the durable settings."""
    assert main(["save", str(run)]) == 0
    assert main(["stop", str(run), "--yes"]) == 0
    names = [c.command_name for c in control.claim(run)]
    assert names == ["save_now", "stop_after_save"]
    assert main(["requeue", str(run), "--suspend"]) == 0
    assert control.read_settings(run).requeue_suspended
    assert main(["requeue", str(run), "--resume"]) == 0
    assert not control.read_settings(run).requeue_suspended
    pin = str(run / "checkpoints" / "a.ckpt")
    assert main(["resume", str(run), "--pin", pin]) == 0
    assert control.read_settings(run).resume_pin == pin
    assert "pinned" in capsys.readouterr().out
    assert main(["resume", str(run), "--clear"]) == 0
    assert control.read_settings(run).resume_pin is None


def test_installed_command_runs(run: Path) -> None:
    """`python -m ckptdash status` works as a real process (what users type)."""
    proc = subprocess.run(
        [sys.executable, "-m", "ckptdash", "status", str(run)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    assert proc.returncode == 0, proc.stderr
    assert "node2" in proc.stdout


def test_status_into_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    """`ckptdash status RUN | head -1` prints no error when head closes the pipe early
    (the table is far longer than a pipe's buffer, so the write really fails)."""
    run = tmp_path / "long"
    with EventWriter(run, attempt=0) as w:
        for step in range(3000):
            w.emit(
                events.CheckpointSaved,
                step=step,
                path=f"/nowhere/checkpoints/step={step:06d}.ckpt",
                trigger="periodic",
                size_bytes=1,
                duration_s=0.1,
            )
    proc = subprocess.run(
        f"{sys.executable} -m ckptdash status {run} --no-scheduler | head -1",
        shell=True,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    assert proc.stdout.startswith("run ")
    assert proc.stderr == ""
