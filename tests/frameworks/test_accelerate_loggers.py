# ruff: noqa: E402  (the tier is skipped, or failed in CI, before accelerate is imported)
"""Accelerate's trackers continue one run across a SIGKILL and a resume, with the call
docs/loggers.md documents (``init_trackers(monitor.loggers.run_id, init_kwargs=...)``): real
Accelerate and TensorBoard, each attempt its own process, read back with TensorBoard's own
``EventAccumulator``."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.frameworks.requires import require

require("accelerate")
event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="install the test extra (tensorboard, wandb, mlflow): make test",
)

from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from ckptdash.rundir import RunDir
from ckptdash.state.reading import load_state
from tests.frameworks.launch import torchrun2
from tests.logger_files import attached, rank_pids, tensorboard_pid
from tests.train.test_distributed import job_env

pytestmark = pytest.mark.integration

WORKER = Path(__file__).with_name("accelerate_logger_worker.py")


def test_accelerate_tensorboard_continues_one_run_across_a_kill(tmp_path: Path) -> None:
    """Saved at step 9, killed without warning at 13, resumed from that save to 20: one
    TensorBoard folder ``<project>/ckptdash-<run id>``, every step once, steps 10-12 (logged
    by the killed attempt, then redone) with the second attempt's values; the run records the
    folder, ``replaced``."""
    run, project = tmp_path / "run", tmp_path / "project"
    env = job_env(tmp_path)

    def launch(tag: str, *kill_at: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, str(WORKER), str(run), str(project), "20", tag, *kill_at]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)

    killed = launch("0", "13")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = launch("1")
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    derived = f"ckptdash-{RunDir(run).info().run_id}"
    (folder,) = [p for p in project.iterdir() if p.name.startswith("ckptdash-")]
    assert folder.name == derived
    first = sorted(folder.glob("events.out.tfevents.*"))[0]  # the killed attempt's file
    logged = [e.step for e in EventFileLoader(str(first)).Load() if _tag(e)]
    assert logged == list(range(13)), "the killed attempt logged 10-12 before dying"
    acc = event_accumulator.EventAccumulator(str(folder))
    acc.Reload()
    rows = [(e.step, e.value) for e in acc.Scalars("tag")]
    assert rows == [(s, 0.0 if s <= 9 else 1.0) for s in range(20)], rows
    record = load_state(run).loggers["tensorboard"]
    assert (record.id, record.attempt, record.step, record.redone) == (derived, 1, 9, "replaced")


def test_accelerate_tensorboard_continues_one_run_across_a_sigusr2_requeue(
    tmp_path: Path,
) -> None:
    """One process in a (fake) SLURM job: SIGUSR2 after step 6, ckptdash saves there,
    requeues the job and stops; the requeued attempt resumes from that save to 20: one
    TensorBoard folder, every step once, 0-6 from the first attempt and 7-19 from the next."""
    run, project = tmp_path / "run", tmp_path / "project"

    def launch(restart: int, *options: str) -> None:
        argv = [sys.executable, str(WORKER), str(run), str(project), "20", str(restart), *options]
        env = job_env(tmp_path, slurm_restart=restart)
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]

    launch(0, "--signal-at", "6")
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    launch(1)
    state = load_state(run)
    (signalled,) = [c for c in state.checkpoints.values() if c.trigger == "signal"]
    assert signalled.step == 6
    (folder,) = [p for p in project.iterdir() if p.name.startswith("ckptdash-")]
    acc = event_accumulator.EventAccumulator(str(folder))
    acc.Reload()
    rows = [(e.step, e.value) for e in acc.Scalars("tag")]
    assert rows == [(s, 0.0 if s <= 6 else 1.0) for s in range(20)], rows
    assert state.loggers["tensorboard"].attempt == 1


def test_two_ranks_log_once_into_one_run_across_a_requeue_and_a_kill(tmp_path: Path) -> None:
    """torchrun x2 (gloo), three launches: SIGUSR2 to rank 1 after step 2 (saved there,
    requeued), then killed without warning (agent and both ranks) at step 13 after the save
    at 9, then to 20: one TensorBoard folder, every step once, each with the value of the
    attempt that ran it last; only rank 0 (Accelerate's main process) wrote event files and
    recorded the tracker."""
    run, project = tmp_path / "run", tmp_path / "project"
    rank0, rank1 = [], []
    for restart, options in enumerate([["--signal-at", "2"], ["13"], []]):
        torchrun2(
            tmp_path, f"launch{restart}", WORKER, str(run), str(project), "20", str(restart),
            *options, slurm_restart=restart, killed=restart == 1,
        )  # fmt: skip
        for pids, pid in zip((rank0, rank1), rank_pids(run), strict=True):
            pids.append(pid)
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    state = load_state(run)
    (saved,) = [c.step for c in state.checkpoints.values() if c.trigger == "signal"]
    assert saved is not None and 2 <= saved < 9
    by_path = {c.path: c.step for c in state.checkpoints.values()}
    assert [by_path[str(state.attempts[n].resumed_from)] for n in (1, 2)] == [saved, 9]

    derived = f"ckptdash-{RunDir(run).info().run_id}"
    (folder,) = [p for p in project.iterdir() if p.name.startswith("ckptdash-")]
    assert folder.name == derived
    files = sorted(folder.glob("events.out.tfevents.*"))
    assert len(files) == 3 and {tensorboard_pid(f) for f in files} == set(rank0), files
    acc = event_accumulator.EventAccumulator(str(folder))
    acc.Reload()
    rows = [(e.step, e.value) for e in acc.Scalars("tag")]
    assert rows == [(s, 0.0 if s <= saved else 1.0 if s <= 9 else 2.0) for s in range(20)]
    events = attached(run)
    assert len(events) == 3 and {e.rank for e in events} == {0}
    assert not set(rank1) & set(rank0)


def _tag(event: Any) -> bool:
    return any(v.tag == "tag" for v in event.summary.value)
