"""Run a script under ``torchrun --nproc-per-node=2`` (gloo, CPU) and fail loudly on a hang."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import kill_tree
from tests.train.test_distributed import _free_port, job_env

LAUNCH_TIMEOUT_S = 270.0
"""A bound on one 2-rank launch (two fit in the test's 600 s): its start-up and a few steps
take 10 to 40 s on two free cores, several times that while a cluster tier starts its jobs."""


def torchrun2(
    tmp_path: Path, name: str, script: Path, *args: str, slurm_restart: int | None = None,
    killed: bool = False,
) -> str:  # fmt: skip
    """Run ``script args`` on 2 ranks; return its output. A hang is killed and fails the test.

    ``slurm_restart``: as a (fake) SLURM job 4242 at that restart count (``job_env``);
    ``killed``: the job is expected to be SIGKILLed (its agent too) instead of exiting 0."""
    log = tmp_path / f"{name}.log"
    env = job_env(tmp_path, slurm_restart=slurm_restart)
    env["HF_HUB_OFFLINE"] = "1"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2"]
    argv += ["--master-addr=127.0.0.1", f"--master-port={_free_port()}", str(script), *args]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        rc = proc.wait(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)  # the ranks too: torchrun starts each in a session of its own
        proc.wait()
        pytest.fail(f"{name}: torchrun hung for {LAUNCH_TIMEOUT_S} s:\n{log.read_text()[-6000:]}")
    text = log.read_text(errors="replace")
    expected = -signal.SIGKILL if killed else 0
    assert rc == expected, f"{name}: torchrun exited {rc}, not {expected}:\n{text[-6000:]}"
    return text
