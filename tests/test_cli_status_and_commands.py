"""What a new user meets first on the command line: `--version`, a folder of many runs as one
line per run, paths relative to the run, an author named once, and an honest word when a
command is sent to a run that no attempt is running."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ckptdash import __version__, control, events
from ckptdash.cli import main
from ckptdash.rundir.writer import EventWriter


def _run(root: Path, *, steps: int = 40, finish: bool = True, t: float | None = None) -> Path:
    """A one-attempt run with one periodic save at ``steps``; finished unless told otherwise."""
    ckpts = root / "checkpoints"
    ckpts.mkdir(parents=True)
    now = time.time() if t is None else t
    with EventWriter(root, attempt=0, host="node1") as w:
        w.emit(events.RunStarted, t=now, max_steps=100)
        (ckpts / f"step={steps}.ckpt").write_bytes(b"x" * 10)
        w.emit(
            events.CheckpointSaved,
            t=now,
            step=steps,
            path=str(ckpts / f"step={steps}.ckpt"),
            trigger="periodic",
            size_bytes=10,
            duration_s=0.1,
        )
        w.emit(events.Heartbeat, t=now, step=steps)
        if finish:
            w.emit(events.RunFinished, t=now, step=steps, reason="completed")
    return root


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    """`ckptdash --version` prints the installed version and exits 0."""
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"ckptdash {__version__}"


def test_status_of_a_folder_is_one_line_per_run_like_squeue(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder of 30 runs prints a header, 30 lines and a footer (not every run in full):
    run, state, attempt, step / max, last event, newest saved checkpoint relative to the run;
    a run's own path prints its detail."""
    for i in range(30):
        _run(tmp_path / f"exp{i:02d}", steps=10 + i, finish=i % 2 == 0)
    assert main(["status", str(tmp_path), "--no-scheduler"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split()[:3] == ["RUN", "STATE", "ATTEMPT"]
    assert len(lines) == 1 + 30 + 2  # header, one per run, a blank line, the footer
    first, second = lines[1].split(), lines[2].split()
    assert first[:6] == ["exp00", "finished", "0", "10", "/", "100"]
    assert second[:3] == ["exp01", "running", "0"]
    assert "checkpoints/step=10.ckpt (step 10)" in lines[1]
    assert str(tmp_path) not in lines[1]
    assert f"ckptdash status {tmp_path / 'exp00'}" in lines[-1]
    assert main(["status", str(tmp_path / "exp05"), "--no-scheduler"]) == 0
    detail = capsys.readouterr().out
    assert detail.startswith("run ")
    assert "next resume: checkpoints/step=15.ckpt" in detail


def test_status_detail_shows_checkpoint_paths_relative_to_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The checkpoint table and the resume line name `checkpoints/...`, not the absolute path
    the job recorded (the run's own path is on the first line)."""
    root = _run(tmp_path / "demo")
    assert main(["status", str(root), "--no-scheduler"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith(str(root))
    assert str(root / "checkpoints") not in out
    assert "checkpoints/step=40.ckpt" in out


def test_a_dashboard_author_names_its_host_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A command from the dashboard (author `user@host (dashboard)`) reads `by
    alice@login1 (dashboard)`, not `alice@login1 (dashboard)@login1`; a CLI command
    (author `bob`, host `login2`) reads `by bob@login2`."""
    root = _run(tmp_path / "exp", finish=False)
    control.issue(root, "save_now", author="alice@login1 (dashboard)", host="login1")
    control.issue(root, "save_now", author="bob", host="login2")
    assert main(["status", str(root), "--no-scheduler"]) == 0
    out = capsys.readouterr().out
    assert "by alice@login1 (dashboard): pending" in out
    assert "(dashboard)@" not in out
    assert "by bob@login2: pending" in out


def test_save_to_a_run_with_no_running_attempt_says_it_will_wait(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a finished run `ckptdash save` still queues the command but says that no attempt
    is running and the command waits for the next one until it expires; with --no-queue it
    refuses (exit 2) and writes nothing. A running run gets no such warning."""
    done = _run(tmp_path / "done")
    assert main(["save", str(done)]) == 0
    err = capsys.readouterr().err
    assert "no attempt is running (finished)" in err
    assert "the command will wait for the next attempt until it expires" in err
    assert len(list((done / "control" / "inbox").glob("*.json"))) == 1
    assert main(["stop", str(done), "--yes", "--no-queue"]) == 2
    assert "no attempt is running" in capsys.readouterr().err
    assert len(list((done / "control" / "inbox").glob("*.json"))) == 1
    stale = _run(tmp_path / "stale", finish=False, t=time.time() - 3600)
    assert main(["save", str(stale), "--no-queue"]) == 2
    assert "(stale)" in capsys.readouterr().err
    live = _run(tmp_path / "live", finish=False)
    assert main(["save", str(live)]) == 0
    assert "no attempt is running" not in capsys.readouterr().err
