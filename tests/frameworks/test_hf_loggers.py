# ruff: noqa: E402  (the tier is skipped, or failed in CI, before transformers is imported)
"""The HF Trainer's ``report_to`` loggers continue one run across a crash and a resume: real
TensorBoard, W&B (offline) and MLflow (a local file store)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.frameworks.requires import require

require("transformers")
event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="install the test extra (tensorboard, wandb, mlflow): make test",
)
wandb = pytest.importorskip("wandb", reason="install the test extra: make test")
mlflow = pytest.importorskip("mlflow", reason="install the test extra: make test")

from transformers import TrainerCallback

import ckptdash
from ckptdash.hf import CkptDashCallback
from ckptdash.rundir import RunDir
from ckptdash.state.reading import load_state
from ckptdash.train import loggers
from tests import wandb_offline
from tests.frameworks.hf_tiny import trainer
from tests.train.test_distributed import job_env

pytestmark = pytest.mark.integration

FAST = {"agree_interval_s": 1e-4, "poll_interval_s": 1e-4}
WORKER = Path(__file__).with_name("hf_logger_worker.py")
_OFFLINE_ENV = ("WANDB_MODE", "WANDB_DIR", "WANDB_SILENT", "WANDB_PROJECT",
                "MLFLOW_ALLOW_FILE_STORE", "MLFLOW_TRACKING_URI")  # fmt: skip


class Crash(RuntimeError):
    pass


class CrashAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            raise Crash(f"boom at {self.step}")


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """W&B offline and MLflow's file store in the test's folder, whatever W&B or MLflow did
    earlier in this process: W&B reads its environment once per process (until
    ``wandb.teardown()``) and MLflow keeps a tracking URI set in-process over the variable."""
    wandb.teardown()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "exp")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for an opt-in
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{tmp_path / 'mlruns'}")
    for name in ("WANDB_RUN_ID", "WANDB_RESUME", "MLFLOW_RUN_ID", "TENSORBOARD_LOGGING_DIR"):
        # ckptdash sets these in this process: set first, so they are taken away after the
        # test (a later test's training processes would inherit them)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # whatever a logger writes next to it stays in the test's folder
    mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
    yield
    wandb.teardown()  # no W&B service of this process for later tests' processes to inherit


def test_report_to_loggers_continue_one_run_across_a_crash(tmp_path: Path, offline: None) -> None:
    """Saved at step 5, crashed at 8, resumed from checkpoint-5 to 12: TensorBoard (in the run
    directory's tensorboard/ckptdash-<id>) shows each step once; MLflow has one run and W&B
    one run id, each with every step once (the redone steps 6 and 7, logged by the crashed
    attempt, are not sent again; read back from MLflow's store and W&B's offline files); the
    run records the three."""
    run, out = tmp_path / "run", tmp_path / "out"
    report = {"report_to": ["tensorboard", "wandb", "mlflow"], "save_steps": 5}
    first = CkptDashCallback(run, **FAST)
    t = trainer(out, steps=12, callbacks=[first, CrashAt(8)], **report)
    with pytest.raises(Crash):
        t.train()
    first.record_failure(Crash())
    mlflow.end_run()  # what the end of a crashed process does (at exit)
    wandb.finish()
    second = CkptDashCallback(run, **FAST)
    t = trainer(out, steps=12, callbacks=[second], **report)
    t.train(resume_from_checkpoint=ckptdash.resume_path(run))
    assert t.state.global_step == 12
    # The ids ckptdash named for the Trainer's loggers are taken back when training ends: no
    # process started later (another run's job) inherits this run's W&B or MLflow id.
    named = ("WANDB_RUN_ID", "WANDB_RESUME", "MLFLOW_RUN_ID", "TENSORBOARD_LOGGING_DIR")
    assert [n for n in named if n in os.environ] == []
    wandb.finish()  # W&B writes its offline file in 32 KiB blocks: the rest at finish

    derived = f"ckptdash-{RunDir(run).info().run_id}"
    folder = run / "tensorboard" / derived
    acc = event_accumulator.EventAccumulator(str(folder))
    acc.Reload()
    steps = [e.step for e in acc.Scalars("train/loss")]
    assert steps == list(range(1, 13)), steps

    client = mlflow.MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    exp_ids = [e.experiment_id for e in client.search_experiments()]
    (ml_run,) = client.search_runs(exp_ids)
    history = client.get_metric_history(ml_run.info.run_id, "loss")
    assert sorted(int(m.step) for m in history) == list(range(1, 13)), "MLflow: each step once"
    offline_runs = sorted((tmp_path / "wandb-home" / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 2 and all(p.name.endswith(derived) for p in offline_runs)
    logged = [s for s, _ in wandb_offline.logged(offline_runs, "train/global_step", "train/loss")]
    assert sorted(logged) == list(range(1, 13)), f"W&B: each step once: {logged}"
    assert not isinstance(wandb.log, loggers.DropUntil), "wandb.log is W&B's own again"
    assert not isinstance(mlflow.log_metrics, loggers.DropUntil)

    state = load_state(run)
    assert {n: i.id for n, i in state.loggers.items()} == {
        "tensorboard": derived,
        "wandb": derived,
        "mlflow": ml_run.info.run_id,
    }
    assert state.loggers["tensorboard"].redone == "replaced"
    assert state.loggers["wandb"].redone == state.loggers["mlflow"].redone == "dropped"


def test_report_to_loggers_continue_one_run_across_a_kill(tmp_path: Path, offline: None) -> None:
    """Saved at step 5, killed without warning (SIGKILL) at 8, resumed to 12, each attempt
    its own process: TensorBoard and MLflow show each step once, W&B no step twice in one
    run id. (W&B's offline service writes 32 KiB blocks: what the killed attempt logged is
    lost with it, so W&B holds only the resumed attempt's steps from 8 on; docs/loggers.md.)"""
    env = dict(job_env(tmp_path), **{k: os.environ[k] for k in _OFFLINE_ENV})
    argv = [sys.executable, str(WORKER), str(tmp_path / "run"), str(tmp_path / "out"), "12"]
    killed = subprocess.run([*argv, "8"], env=env, capture_output=True, text=True, timeout=240)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    run = tmp_path / "run"
    derived = f"ckptdash-{RunDir(run).info().run_id}"
    acc = event_accumulator.EventAccumulator(str(run / "tensorboard" / derived))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(1, 13))
    client = mlflow.MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    (ml_run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    history = client.get_metric_history(ml_run.info.run_id, "loss")
    assert sorted(int(m.step) for m in history) == list(range(1, 13)), "MLflow: each step once"
    offline_runs = sorted((tmp_path / "wandb-home" / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 2 and all(p.name.endswith(derived) for p in offline_runs)
    logged = [s for s, _ in wandb_offline.logged(offline_runs, "train/global_step", "train/loss")]
    assert len(logged) == len(set(logged)) and set(range(8, 13)) <= set(logged), logged
    state = load_state(run)
    assert state.loggers["wandb"].redone == state.loggers["mlflow"].redone == "dropped"
    assert (state.loggers["mlflow"].attempt, state.loggers["mlflow"].step) == (1, 5)
