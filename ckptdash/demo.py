"""``ckptdash demo``: a small real Lightning run on CPU under a local stand-in scheduler.

The stand-in plays SLURM's part: it starts the training as attempt 0, sends
it the requeue signal (SIGUSR2) after ``preempt_every_s`` seconds, and when the
job asked to be requeued (through the requeue command template ckptdash runs)
starts the next attempt, which resumes from the signal checkpoint. So a
newcomer sees periodic saves, a preemption, a signal save, a requeue and a
resume — with no SLURM and no GPU.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ckptdash.resume import load_state

REQUEUE_MARKER = ".demo-requeue"
_last_line = [""]


def run_demo(
    run_dir: Path, *, steps: int = 300, preempt_every_s: float = 8.0, max_preemptions: int = 2
) -> int:
    """Run attempts until the training finishes; returns the exit status."""
    run_dir.mkdir(parents=True, exist_ok=True)
    marker = run_dir / REQUEUE_MARKER
    attempt, preemptions = 0, 0
    print(f"ckptdash demo: training {steps} steps in {run_dir} (Ctrl-C stops everything)")
    while True:
        marker.unlink(missing_ok=True)
        env = {
            **os.environ,
            "CKPTDASH_ATTEMPT": str(attempt),
            "CKPTDASH_JOB_ID": f"demo-{os.getpid()}",
        }
        cmd = [sys.executable, "-m", "ckptdash.demo_train", str(run_dir), str(steps), str(marker)]
        log_dir = run_dir / "logs"
        log_dir.mkdir(exist_ok=True)
        # Lightning's own chatter goes to a log file so the progress line stays readable.
        with open(log_dir / f"attempt-{attempt}.log", "wb") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        # The clock starts once this attempt trains (its handlers are installed by then).
        deadline: float | None = None
        try:
            while proc.poll() is None:
                training = _progress(run_dir) == attempt
                if deadline is None and training and preemptions < max_preemptions:
                    deadline = time.monotonic() + preempt_every_s
                if deadline is not None and time.monotonic() >= deadline:
                    print(f"\nckptdash demo: preempting attempt {attempt} (SIGUSR2)")
                    proc.send_signal(signal.SIGUSR2)
                    preemptions += 1
                    deadline = float("inf")
                time.sleep(0.25)
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
            print("\nckptdash demo: interrupted")
            return 130
        _progress(run_dir, final=True)
        if proc.returncode != 0:
            print(
                f"ckptdash demo: attempt {attempt} failed (exit {proc.returncode});"
                f" see {log_dir / f'attempt-{attempt}.log'}"
            )
            return 1
        if not marker.exists():
            break
        attempt += 1
        print(f"ckptdash demo: requeued; starting attempt {attempt}")
    marker.unlink(missing_ok=True)
    print(f"ckptdash demo: done. See it all with: ckptdash status {run_dir}")
    return 0


def _progress(run_dir: Path, final: bool = False) -> int | None:
    """Draw the progress line; returns the attempt that is training now, if any."""
    try:
        state = load_state(run_dir)
    except Exception:
        return None
    attempt = max(state.attempts, default=None)
    info = state.attempts.get(attempt) if attempt is not None else None
    if info is None:
        return None
    total = info.max_steps or 0
    step = info.step or 0
    width = 30
    filled = int(width * step / total) if total else 0
    bar = "#" * filled + "-" * (width - filled)
    saves = len(state.checkpoints)
    line = f"\rattempt {attempt} [{bar}] step {step}/{total}  checkpoints {saves}"
    if line != _last_line[0] or final:
        _last_line[0] = line
        sys.stdout.write(line + ("\n" if final else ""))
        sys.stdout.flush()
    return attempt if info.step is not None and info.outcome == "running" else None
