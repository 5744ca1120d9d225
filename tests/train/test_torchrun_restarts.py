"""torchrun ``--max-restarts`` (docs/launchers.md): each restart is a new ckptdash attempt
that resumes from the newest valid checkpoint, with the real torchrun."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.train.helpers import state_of

WORKER = textwrap.dedent(
    """
    import sys, torch, ckptdash
    run = sys.argv[1]
    model = torch.nn.Linear(4, 1)
    with ckptdash.Monitor(run, max_steps=12, pulse_interval_s=0) as monitor:
        state = monitor.load()
        start = 0
        if state is not None:
            model.load_state_dict(state["model"])
            start = state["step"] + 1
        for step in range(start, 12):
            monitor.step(step)
            if step == 5:
                monitor.save({"model": model.state_dict(), "step": step}, trigger="periodic")
            if step == 7 and state is None:
                raise RuntimeError("a worker died at step 7")  # the first attempt only
    """
)


def test_torchrun_max_restarts_resumes_each_restart_from_the_newest_checkpoint(
    tmp_path: Path,
) -> None:
    """A worker that fails under ``torchrun --max-restarts=1`` is restarted by torchrun; the
    restart is attempt 1, resumes from the step-5 save, and completes; attempt 0 is failed."""
    run, script = tmp_path / "run", tmp_path / "worker.py"
    script.write_text(WORKER)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"]
    argv += ["--max-restarts=1", "--monitor-interval=0.1", str(script), str(run)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    attempts = state_of(run).attempts
    assert [a.outcome for a in attempts.values()] == ["failed", "finished"]
    assert "a worker died at step 7" in attempts[0].end_reason
    resumed = attempts[1].resumed_from
    assert resumed is not None and resumed.endswith("step=5.ckpt")
