"""The README's main command: `ckptdash demo` preempts, saves, requeues and resumes, and
serves the live dashboard while it does."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckptdash.state.reading import load_state

ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}


SAMPLE = Path(__file__).parents[1] / "docs" / "demo.md"  # the README links its sample output


def _demo(
    *args: str, timeout: float = 240, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckptdash", "demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=ENV,
        cwd=cwd,
    )


def _shape(line: str) -> str:
    """A line with its run id, numbers and spacing made generic (they differ run to run)."""
    line = re.sub(r"token=[\w-]+", "token=T", line)
    line = re.sub(r"/ck-[0-9a-f]{32}/", "/ck-P/", line)  # the URL's secret path
    line = re.sub(r"\b[0-9a-f]{12}\b", "ID", line)
    return " ".join(re.sub(r"\d+", "N", line).split())


def _readme_block(marker: str, skip: int = 0) -> list[str]:
    """The lines of the sample page's code block number ``skip`` (from 0) after ``marker``."""
    text = SAMPLE.read_text()
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text[text.index(marker) :], flags=re.S)
    return str(blocks[skip]).splitlines()


def test_demo_shows_preemption_signal_save_requeue_kill_and_resume(tmp_path: Path) -> None:
    """A short demo (options for a fast test; the default is the same story at a minute)
    prints the dashboard's URL before it trains, then: attempt 0 is preempted, saves on the
    signal, is requeued; attempt 1 resumes from that checkpoint and is killed without warning;
    attempt 2 resumes from the newest valid checkpoint and finishes at exactly the requested
    step. --exit-when-done ends it with the training. What it and `ckptdash status` print
    is what the sample output of docs/demo.md (linked from the README) shows."""
    run = tmp_path / "runs" / "demo"
    proc = _demo(
        "--run-dir",
        "runs/demo",
        "--steps",
        "150",
        "--preempt-every",
        "1",
        "--max-preemptions",
        "1",
        "--kills",
        "1",
        "--port",
        "0",
        "--exit-when-done",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    url = re.search(r"live dashboard at http://127\.0\.0\.1:\d+/\S*", out)
    assert url, out
    assert url.start() < out.index("training 150 steps"), "the URL comes before the training"
    assert "preempting attempt 0" in out
    assert "killing attempt 1 without warning" in out
    # The progress line redraws itself with a real carriage return (read here as a newline:
    # text mode), not one the output filter escaped for event text.
    assert "\nattempt 0 [" in out and "\\u000d" not in out
    assert "still serving" not in out
    state = load_state(run)
    assert sorted(state.attempts) == [0, 1, 2]
    first, killed, last = state.attempts[0], state.attempts[1], state.attempts[2]
    assert (first.outcome, first.end_reason) == ("stopped", "preempted")
    (signal_ckpt,) = [c for c in state.checkpoints.values() if c.trigger == "signal"]
    assert [r.issued for r in state.requeues] == [True]
    # The signal save, or a periodic save that landed on the same step after it: the rule
    # takes the newest by (step, time), and both hold the same training state.
    assert killed.resumed_from is not None
    assert state.checkpoints[killed.resumed_from].step == signal_ckpt.step
    assert killed.outcome == "lost", "a SIGKILLed attempt never says it ended"
    assert last.resumed_from is not None
    assert state.checkpoints[last.resumed_from].step >= signal_ckpt.step
    assert (last.outcome, last.step) == ("finished", 150)

    # The sample output (docs/demo.md) is what the demo and `ckptdash status` print (numbers,
    # ids and table rows aside): its own lines, and the status lines that name no checkpoint.
    printed = {_shape(line) for line in out.replace("\r", "\n").splitlines()}
    said = [s for s in _readme_block("`make demo` prints") if s.startswith("ckptdash demo")]
    assert len(said) >= 6
    assert [s for s in said if _shape(s) not in printed] == []
    status = subprocess.run(
        [sys.executable, "-m", "ckptdash", "status", "runs/demo"],
        capture_output=True,
        text=True,
        check=True,
        env=ENV,
        cwd=tmp_path,
    ).stdout
    shown = {_shape(line) for line in status.splitlines()}
    sample = _readme_block("Then, in another terminal:", skip=1)
    sample = [s for s in sample if s and not s[0].isdigit() and s != "..."]
    assert len(sample) >= 8
    assert [s for s in sample if _shape(s) not in shown] == []


def test_the_default_demo_lasts_about_a_minute_with_two_preemptions_and_a_kill() -> None:
    """`ckptdash demo` with no options: 1,200 steps of ~30 ms (about 40 s of training), two
    SIGUSR2 preemptions, then one SIGKILL, 10 s of training apart (the run above proves the
    story; this pins the defaults the README promises)."""
    from ckptdash.cli import _parser

    args = _parser().parse_args(["demo"])
    assert (args.steps, args.preempt_every, args.max_preemptions, args.kills) == (
        1200,
        10.0,
        2,
        1,
    )


def test_a_second_demo_trains_a_new_demo_in_a_fresh_folder_it_names_first(
    tmp_path: Path,
) -> None:
    """`ckptdash demo` run again (as `make demo` does, no --run-dir) trains a new demo: its
    first line names the fresh folder (runs/demo-2), which holds a whole new training, and the
    first demo is left as it was. An explicit --run-dir that holds a demo is refused, saying
    how to go on. With --no-serve each trains without a dashboard (no address printed) and
    ends with the training."""
    quick = ("--steps", "12", "--max-preemptions", "0", "--kills", "0", "--no-serve")
    first = _demo(*quick, cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "runs/demo-2" not in first.stdout and "http://" not in first.stdout
    assert load_state(tmp_path / "runs" / "demo").attempts[0].outcome == "finished"
    before = sorted(p.name for p in (tmp_path / "runs" / "demo" / "events").iterdir())

    second = _demo(*quick, cwd=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "runs/demo-2" in second.stdout.splitlines()[0]
    assert "training 12 steps in runs/demo-2" in second.stdout
    fresh = load_state(tmp_path / "runs" / "demo-2")
    assert [(a.outcome, a.step, a.resumed_from) for a in fresh.attempts.values()] == [
        ("finished", 12, None)
    ]
    assert sorted(p.name for p in (tmp_path / "runs" / "demo" / "events").iterdir()) == before

    again = _demo("--run-dir", "runs/demo", *quick, cwd=tmp_path, timeout=60)
    assert again.returncode == 2, again.stdout + again.stderr
    assert "runs/demo: holds an earlier demo" in again.stderr
    assert "--run-dir" in again.stderr and "Traceback" not in again.stderr


def test_a_taken_port_is_one_line_naming_the_options_before_any_training(
    tmp_path: Path,
) -> None:
    """When --port is in use the demo says so in one line (exit 2) and trains nothing."""
    run = tmp_path / "demo"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _demo("--run-dir", str(run), "--port", str(port), timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"port {port} is in use" in proc.stderr
    assert "--no-serve" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (run / "events").exists()


REPO = Path(__file__).parents[1]
# Long enough never to finish during the test; no server, preemption or kill to wait for.
_ENDLESS = ("--steps", "100000", "--no-serve", "--max-preemptions", "0", "--kills", "0")


def _ctrl_c_while_training(argv: list[str], run: Path, log: Path) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a process group of its own (a terminal's foreground job), wait until
    the demo's attempt 0 trains (its progress line shows a step), then press Ctrl-C: SIGINT
    to the whole group, as a terminal sends it. Returns the ended process."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=ENV, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 120
        while not re.search(r"step [1-9]\d*/", log.read_text()):
            assert proc.poll() is None, f"the demo ended before Ctrl-C:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"no training step in 120 s:\n{log.read_text()}"
            time.sleep(0.2)  # nothing to wait on but the log file
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    attempt = load_state(run).attempts[0]
    assert attempt.outcome != "running", "the attempt did not record its end"
    if attempt.pid is not None:  # its own session: Ctrl-C reached it through the demo only
        assert not Path(f"/proc/{attempt.pid}").exists() or "Z" in _state(attempt.pid)
    return proc


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


@pytest.mark.skipif(
    shutil.which("make") is None and os.environ.get("CI") != "true",
    reason="no make; install it (apt-get install make) to run `make demo` here",
)
def test_make_demo_then_ctrl_c_prints_no_error(tmp_path: Path) -> None:
    """`make demo` stopped with Ctrl-C, as the README says, while an attempt trains: the demo
    stops the attempt (which records its end), says goodbye in one line naming the run and
    exits 0, so make reports no error (it printed "Error 130" when the demo exited 130); no
    traceback."""
    run, log = tmp_path / "demo", tmp_path / "make.log"
    venv = Path(sys.prefix)  # the venv running the tests, already set up: -o skips `setup`
    argv = ["make", "-C", str(REPO), "--no-print-directory", f"VENV={venv}"]
    argv += ["-o", f"{venv}/.ckptdash-installed", "demo"]
    argv.append("ARGS=" + " ".join(["--run-dir", str(run), *_ENDLESS]))
    proc = _ctrl_c_while_training(argv, run, log)
    output = log.read_text()
    assert "Error" not in output and "Traceback" not in output, output
    assert proc.returncode == -signal.SIGINT, output  # make itself ends on the Ctrl-C, silently
    assert output.strip().splitlines()[-1] == (
        f"ckptdash demo: stopped by Ctrl-C, goodbye. See the run with: ckptdash status {run}"
    ), output
