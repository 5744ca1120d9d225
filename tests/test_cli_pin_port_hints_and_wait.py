"""The command line on a second try: the paths `ckptdash status` printed work as input, a busy
port or another tool's flag says what to type instead, a typo gets its suggestion, and
`save --wait` / `stop --wait` print the job's answer."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptdash import control
from ckptdash._dev.testing import ServeProcess
from ckptdash.cli import main
from ckptdash.state.reading import load_state
from tests.test_cli_status_and_commands import _run

ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}

TRAIN = textwrap.dedent(
    """
    import sys, threading, torch, ckptdash
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step_time = threading.Event()  # never set: each step takes 20 ms, like real work
    with ckptdash.Monitor(sys.argv[1], max_steps=100_000, poll_interval_s=0.01,
                          agree_interval_s=0.001) as monitor:
        for step in range(100_000):
            loss = (model(torch.randn(8, 4)) ** 2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
            step_time.wait(0.02)
            monitor.step(step, loss=loss.item())
            if monitor.should_save:
                monitor.save({"model": model.state_dict(), "step": step})
            if monitor.should_stop:
                break
    """
)


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckptdash", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=ENV,
    )


def test_resume_pin_takes_the_path_status_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ckptdash resume RUN --pin PATH` accepts the checkpoint path exactly as `ckptdash
    status RUN` printed it (relative to the run), as well as RUN/checkpoints/... from here and
    the absolute path; a path the run never recorded is still refused."""
    root = _run(tmp_path / "runs" / "exp1", steps=40)
    monkeypatch.chdir(tmp_path)
    assert main(["status", "runs/exp1", "--no-scheduler"]) == 0
    printed = re.search(r"\s(checkpoints/step=40\.ckpt)\b", capsys.readouterr().out)
    assert printed is not None
    absolute = str(root / "checkpoints" / "step=40.ckpt")
    for pin in (printed.group(1), "runs/exp1/checkpoints/step=40.ckpt", absolute):
        assert main(["resume", "runs/exp1", "--clear"]) == 0
        assert main(["resume", "runs/exp1", "--pin", pin]) == 0, pin
        assert control.read_settings(root).resume_pin == absolute, pin
        assert "pinned" in capsys.readouterr().out
    assert main(["resume", "runs/exp1", "--pin", "checkpoints/step=41.ckpt"]) == 2
    assert "not a checkpoint this run recorded" in capsys.readouterr().err


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another program is listening on (its own process, as a second server would)."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen();"
            " print(s.getsockname()[1], flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    try:
        yield int(holder.stdout.readline())
    finally:
        holder.kill()
        holder.wait()


def test_serve_on_a_busy_port_says_which_option_to_use(tmp_path: Path, held_port: int) -> None:
    """`ckptdash serve RUN --port N` where another process listens on N: one line naming the
    port and the options (--port N, --port 0), exit 2, no traceback."""
    root = _run(tmp_path / "exp1")
    proc = _cli("serve", str(root), "--port", str(held_port))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"port {held_port} on 127.0.0.1 is in use" in proc.stderr
    assert "--port 0 for any free port" in proc.stderr
    assert "Traceback" not in proc.stderr and "Address already in use" not in proc.stderr


def test_tensorboards_flags_serve_the_run_or_name_ckptdashs_own(tmp_path: Path) -> None:
    """`ckptdash serve --logdir RUN --host 127.0.0.1`, as a TensorBoard user types it, serves
    the run; `--bind_all` is refused with the ckptdash flags that do that."""
    root = _run(tmp_path / "exp1")
    with ServeProcess(f"--logdir={root}", "--host", "127.0.0.1") as server:
        assert server.url.startswith("http://127.0.0.1:")
        assert f"serving {root}" in server.log()
    proc = _cli("serve", "--logdir", str(root), "--bind_all")
    assert proc.returncode == 2
    assert "--address 0.0.0.0 --allow-remote" in proc.stderr


def test_a_mistyped_command_gets_the_command_it_meant(capsys: pytest.CaptureFixture[str]) -> None:
    """`ckptdash stauts RUN` says "did you mean `ckptdash status`?" in one line, exit 2."""
    assert main(["stauts", "runs/x"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no command 'stauts'; did you mean `ckptdash status`?" in err
    assert len(err.splitlines()) == 1


def test_save_and_stop_wait_for_the_jobs_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Against a real training loop: `ckptdash save RUN --wait` prints that the job applied
    it, with the checkpoint's path relative to the run and a short command id; `ckptdash stop
    RUN --yes --wait` prints its answer and the job has ended. With nothing running, `--wait
    --timeout` gives up after that long, exit 1, saying the command stays queued."""
    run = tmp_path / "run"
    job = subprocess.Popen([sys.executable, "-c", TRAIN, str(run)], env=ENV)
    try:
        # Each look replays the log: a look every 50 ms leaves the CPU to the job.
        deadline = time.monotonic() + 90
        pause = threading.Event()  # never set: an interruptible pause between looks
        while not (run.is_dir() and any(a.step for a in load_state(run).attempts.values())):
            assert time.monotonic() < deadline and job.poll() is None, "the job never trained"
            pause.wait(0.05)
        assert main(["save", str(run), "--wait", "--timeout", "30"]) == 0
        answer = capsys.readouterr().out.splitlines()[-1]
        assert re.fullmatch(r"save_now [0-9a-f]{8} applied by attempt 0: \S+\.\S+", answer)
        assert str(run) not in answer
        assert main(["stop", str(run), "--yes", "--wait", "--timeout", "30"]) == 0
        assert re.search(
            r"stop_after_save [0-9a-f]{8} applied by attempt 0", capsys.readouterr().out
        )
        assert job.wait(timeout=30) == 0
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert main(["save", str(run), "--wait", "--timeout", "0.5"]) == 1
    assert "no answer within 0.5 s; it stays queued" in capsys.readouterr().err


def test_requeue_wait_says_there_is_nothing_to_wait_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ckptdash requeue RUN --suspend --wait` (typed like save/stop --wait) suspends, and says
    the setting is in force at once: the job sends no answer to a setting."""
    root = _run(tmp_path / "exp1")
    assert main(["requeue", str(root), "--suspend", "--wait"]) == 0
    said = capsys.readouterr()
    assert "auto-requeue: suspended" in said.out
    assert "nothing to wait for: the setting above is in force now" in said.err
    assert control.read_settings(root).requeue_suspended
