"""Lightning's multi-process launchers on CPU (gloo, 2 ranks): ddp and ddp_spawn.

Each test runs ``lightning_launch_worker.py`` as its own program, the way a user
runs a training script, and replays the run directory's events.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import WaitUntil
from tests.train.helpers import state_of
from tests.train.test_distributed import job_env

pytest.importorskip("lightning.pytorch", reason="install the lightning extra: make test")

pytestmark = pytest.mark.integration

WORKER = Path(__file__).with_name("lightning_launch_worker.py")
TIMEOUT_S = 120.0


class Launch:
    """One run of the worker program, in its own session (killed whole on a hang)."""

    def __init__(self, tmp_path: Path, env: dict[str, str], *options: str) -> None:
        self.run, self.reports = tmp_path / "run", tmp_path / "reports"
        self.log = tmp_path / "launch.log"
        argv = [sys.executable, str(WORKER), str(self.run), str(self.reports), *options]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv, env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def wait(self) -> dict[str, Any]:
        """The launcher's report once it exited (fails the test on a hang)."""
        try:
            self.proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the launch hung for {TIMEOUT_S} s:\n{self.output()}")
        report = self.reports / "launcher.json"
        assert report.exists(), f"exit {self.proc.returncode}:\n{self.output()}"
        out: dict[str, Any] = json.loads(report.read_text())
        out["returncode"] = self.proc.returncode
        return out

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def launch(tmp_path: Path) -> Any:
    launches: list[Launch] = []

    def start(*options: str, slurm: bool = False) -> Launch:
        env = job_env(tmp_path, slurm_restart=0 if slurm else None)
        one = Launch(tmp_path, env, *options)
        launches.append(one)
        return one

    yield start
    for one in launches:
        one.kill()


def _run_failed_ranks(run: Path) -> dict[int, str]:
    out = {}
    for f in (run / "events").iterdir():
        for line in f.read_text().splitlines():
            ev = json.loads(line)
            if ev["kind"] == "run_failed":
                out[ev["rank"]] = ev["error"]
    return out


@pytest.mark.parametrize(("strategy", "raising"), [("ddp", "1"), ("ddp_spawn", "-1")])
def test_a_crash_under_ddp_is_recorded_on_every_rank(
    launch: Any, strategy: str, raising: str
) -> None:
    """A crash records run_failed on every rank with its own error, and the attempt is failed
    with the first error as its cause: under ddp with only rank 1 raising (Lightning calls
    on_exception, never teardown; rank 0 then fails in its collective) and under ddp_spawn
    with both workers raising (a worker runs fit() with no hook at all on the way out)."""
    job = launch("--strategy", strategy, "--raise-at", "5", "--raise-rank", raising)
    report = job.wait()
    assert report["error"], job.output()
    failed = _run_failed_ranks(job.run)
    assert sorted(failed) == [0, 1], job.output()
    assert failed[1] == "RuntimeError: boom at step 5 on rank 1"
    (attempt,) = state_of(job.run).attempts.values()
    assert attempt.outcome == "failed"
    if raising == "1":
        assert attempt.end_reason == failed[1]  # the cause, not rank 0's lost connection


def test_ddp_spawn_launcher_signal_reaches_the_workers(
    launch: Any, tmp_path: Path, wait_until: WaitUntil
) -> None:
    """USR2 sent to the ddp_spawn launcher (what SLURM's --signal=B: reaches with `exec python`)
    is passed to the workers: one signal save at a step boundary, the requeue, a clean stop and
    exit; Lightning's internal hand-over file /tmp/.../.temp.ckpt is never recorded."""
    job = launch("--strategy", "ddp_spawn", "--steps", "400", "--ready-at", "3", slurm=True)
    wait_until(lambda: (job.reports / "ready").exists(), timeout=TIMEOUT_S, what="step 3")
    os.kill(job.proc.pid, signal.SIGUSR2)
    report = job.wait()
    assert report["error"] is None and report["returncode"] == 0, job.output()
    assert report["global_step"] < 400
    state = state_of(job.run)
    (attempt,) = state.attempts.values()
    assert attempt.outcome == "stopped" and attempt.end_reason == "preempted"
    assert {s.signal for s in state.signals} == {"SIGUSR2"}
    (saved,) = state.checkpoints.values()  # the signal save, and nothing else
    assert saved.trigger == "signal" and saved.status == "saved"
    assert not any(".temp.ckpt" in p for p in state.checkpoints)
    (requeue,) = state.requeues
    assert requeue.issued
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
