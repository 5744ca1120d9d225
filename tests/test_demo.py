"""The README's main command: `ckptdash demo` preempts, saves, requeues and resumes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ckptdash.resume import load_state


def test_demo_shows_preemption_signal_save_requeue_and_resume(tmp_path: Path) -> None:
    """A short demo run ends with two attempts: a signal save, a requeue, a resume from that
    checkpoint, and a finished training at exactly the requested step."""
    run = tmp_path / "runs" / "demo"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ckptdash",
            "demo",
            "--run-dir",
            str(run),
            "--steps",
            "80",
            "--preempt-every",
            "1",
            "--max-preemptions",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "preempting attempt 0" in proc.stdout
    state = load_state(run)
    assert sorted(state.attempts) == [0, 1]
    first, second = state.attempts[0], state.attempts[1]
    assert (first.outcome, first.end_reason) == ("stopped", "preempted")
    (signal_ckpt,) = [c for c in state.checkpoints.values() if c.trigger == "signal"]
    assert [r.issued for r in state.requeues] == [True]
    assert second.resumed_from == signal_ckpt.path
    assert (second.outcome, second.step) == ("finished", 80)
