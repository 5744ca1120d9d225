"""Shared pieces of the training-side tests: a fake scontrol and a tiny plain-PyTorch loop."""

from __future__ import annotations

import os
import signal
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import ckptdash
from ckptdash.state import RunState
from ckptdash.state.reading import load_state


def fake_scontrol(bin_dir: Path, log: Path, exit_code: int = 0) -> None:
    """Put an ``scontrol`` on ``bin_dir`` that appends its arguments to ``log``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "scontrol"
    script.write_text(
        f'#!/bin/sh\necho "$@" >> "{log}"\n'
        + (f'echo "requeue refused" >&2\nexit {exit_code}\n' if exit_code else "")
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def slurm_env(monkeypatch: Any, bin_dir: Path, *, job_id: str = "4242", restart: int = 0) -> None:
    """Look like a SLURM batch job whose scontrol is the fake one."""
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", job_id)
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    monkeypatch.setenv("SLURM_RESTART_COUNT", str(restart))


def train_loop(
    run_dir: Path,
    *,
    total_steps: int,
    on_step: Callable[[int], None] | None = None,
    **options: Any,
) -> tuple[int, int | None]:
    """A plain-PyTorch loop with Monitor; returns (first step run, last step finished).

    Resumes from the resume rule's checkpoint; saves when ckptdash says so; stops when told.
    """
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    options.setdefault("agree_interval_s", 0.001)
    options.setdefault("poll_interval_s", 0.001)
    last: int | None = None
    with ckptdash.Monitor(run_dir, max_steps=total_steps, **options) as monitor:
        state = monitor.load()
        start = 0
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            start = state["step"] + 1
        for step in range(start, total_steps):
            x = torch.randn(8, 4)
            loss = (model(x) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            last = step
            if on_step is not None:
                on_step(step)
            monitor.step(step, loss=loss.item())
            if monitor.should_save:
                monitor.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step})
            if monitor.should_stop:
                break
    return start, last


def send_self(signum: int = signal.SIGUSR2) -> None:
    os.kill(os.getpid(), signum)


def state_of(run_dir: Path) -> RunState:
    return load_state(run_dir)


def loop_state(step: int) -> dict[str, Any]:
    """A checkpoint in the shape train_loop saves, as of ``step``."""
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return {"model": model.state_dict(), "opt": opt.state_dict(), "step": step}


def next_wall_second(since: float) -> None:
    """Return once the wall clock has left the second ``since`` fell in.

    W&B names an offline run's folder after the second it started and its run id: two
    attempts of one run that start within the same second (a crash and an instant restart,
    as these tests do) would share one folder, and the tests count one folder per attempt.
    (W&B's "run ID ... is in use" is another matter: a shared W&B service, docs/loggers.md.)"""
    import threading
    import time

    pause = threading.Event()  # never set: short waits until the condition holds
    while int(time.time()) <= int(since):
        pause.wait(0.01)


def note_pid(run_dir: Path) -> None:
    """Each rank of a job writes its pid to ``RUN_DIR.pid<rank>``: :func:`kill_job` reads the
    other ranks' there, and a test tells by them which process wrote a logger's files."""
    Path(f"{run_dir}.pid{os.environ.get('RANK', '0')}").write_text(f"{os.getpid()}\n")


def kill_job(run_dir: Path) -> None:
    """The node is gone: after a 0.3 s stall (the pulses show where the job got), SIGKILL the
    torchrun agent (when there is one), the job's other ranks (by the pids :func:`note_pid`
    wrote) and this process, in that order; no handler runs anywhere."""
    import threading

    threading.Event().wait(0.3)
    pids = []
    if "TORCHELASTIC_RUN_ID" in os.environ:  # torchrun's agent is the parent of each rank
        pids.append(os.getppid())
    me = int(os.environ.get("RANK", "0"))
    for rank in range(int(os.environ.get("WORLD_SIZE", "1"))):
        if rank != me:
            pids.append(int(Path(f"{run_dir}.pid{rank}").read_text()))
    for pid in [*pids, os.getpid()]:
        os.kill(pid, signal.SIGKILL)
