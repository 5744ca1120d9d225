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


def _tag(event: Any) -> bool:
    return any(v.tag == "tag" for v in event.summary.value)
