"""The README's main command: `ckptdash demo` preempts, saves, requeues and resumes, and
serves the live dashboard while it does."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from ckptdash.resume import load_state

ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}


def _demo(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckptdash", "demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=ENV,
    )


def test_demo_shows_preemption_signal_save_requeue_and_resume(tmp_path: Path) -> None:
    """A short demo run ends with two attempts: a signal save, a requeue, a resume from that
    checkpoint, and a finished training at exactly the requested step. It printed the URL of
    the dashboard it served meanwhile, and --exit-when-done ended it with the training."""
    run = tmp_path / "runs" / "demo"
    proc = _demo(
        "--run-dir",
        str(run),
        "--steps",
        "80",
        "--preempt-every",
        "1",
        "--max-preemptions",
        "1",
        "--port",
        "0",
        "--exit-when-done",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "preempting attempt 0" in proc.stdout
    assert re.search(r"live dashboard at http://127\.0\.0\.1:\d+/", proc.stdout), proc.stdout
    assert "still serving" not in proc.stdout
    state = load_state(run)
    assert sorted(state.attempts) == [0, 1]
    first, second = state.attempts[0], state.attempts[1]
    assert (first.outcome, first.end_reason) == ("stopped", "preempted")
    (signal_ckpt,) = [c for c in state.checkpoints.values() if c.trigger == "signal"]
    assert [r.issued for r in state.requeues] == [True]
    # The signal save, or a periodic save that landed on the same step after it: the rule
    # takes the newest by (step, time), and both hold the same training state.
    assert second.resumed_from is not None
    assert state.checkpoints[second.resumed_from].step == signal_ckpt.step
    assert (second.outcome, second.step) == ("finished", 80)


def test_demo_without_serving_prints_no_url(tmp_path: Path) -> None:
    """--no-serve trains without a dashboard (and so ends with the training)."""
    run = tmp_path / "demo"
    proc = _demo("--run-dir", str(run), "--steps", "10", "--max-preemptions", "0", "--no-serve")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "http://" not in proc.stdout
    assert load_state(run).attempts[0].outcome == "finished"


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
