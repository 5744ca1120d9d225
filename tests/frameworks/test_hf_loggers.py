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
from ckptdash.rundir import RunDir, manifest
from ckptdash.state.reading import load_state
from ckptdash.train.tracking import loggers
from tests import wandb_offline
from tests.conftest import WaitUntil
from tests.frameworks.hf_tiny import trainer
from tests.frameworks.launch import torchrun2
from tests.logger_files import attached, rank_pids, tensorboard_pid, wandb_pid
from tests.train.test_distributed import job_env
from tests.wandb_launcher import launcher_service

pytestmark = pytest.mark.integration

FAST = {"agree_interval_s": 1e-4, "poll_interval_s": 1e-4}
WORKER = Path(__file__).with_name("hf_logger_worker.py")
_OWN_SERVICE = "ckptdash: W&B: this attempt starts its own wandb service"
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


class SignalSelfAt(TrainerCallback):
    """The process sends itself SIGUSR2 at the end of step ``step`` (a preemption's warning)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGUSR2)


@pytest.mark.parametrize("ending", ["crash", "sigusr2"])
def test_report_to_loggers_continue_one_run_across_a_crash(
    tmp_path: Path, offline: None, ending: str, wait_until: WaitUntil
) -> None:
    """Saved at step 5, crashed at 8, resumed from checkpoint-5 to 12 (or: SIGUSR2 at step 8,
    saved there and stopped, resumed from that save): TensorBoard (in the run directory's
    tensorboard/ckptdash-<id>) shows each step once; MLflow has one run and W&B one run id,
    each with every step once (the redone steps 6 and 7, logged by the crashed attempt, are
    not sent again; read back from MLflow's store and W&B's offline files); the run records
    the three."""
    run, out = tmp_path / "run", tmp_path / "out"
    report = {"report_to": ["tensorboard", "wandb", "mlflow"], "save_steps": 5}
    first = CkptDashCallback(run, **FAST)
    if ending == "crash":
        t = trainer(out, steps=12, callbacks=[first, CrashAt(8)], **report)
        with pytest.raises(Crash):
            t.train()
        first.record_failure(Crash())
        mlflow.end_run()  # what the end of a crashed process does (at exit)
    else:
        # Before ckptdash's own callback, so that it sees the signal at the same boundary.
        t = trainer(out, steps=12, callbacks=[SignalSelfAt(8), first], **report)
        t.train()
        assert t.state.global_step == 8, "ckptdash stops the Trainer after the signal's save"
        (signalled,) = [c for c in load_state(run).checkpoints.values() if c.trigger == "signal"]
        assert signalled.step == 8
        assert ckptdash.resume_path(run) == signalled.path
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
    # both attempts ended with wandb.finish()
    wait_until(lambda: all(map(wandb_offline.closed, offline_runs)), 60, "W&B's exit records")
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
    if ending == "crash":  # redone steps: 6 and 7
        assert state.loggers["tensorboard"].redone == "replaced"
        assert state.loggers["wandb"].redone == state.loggers["mlflow"].redone == "dropped"


def test_report_to_loggers_continue_one_run_across_a_kill(
    tmp_path: Path, offline: None, wait_until: WaitUntil
) -> None:
    """Saved at step 5, killed without warning (SIGKILL) at 8 in a process of its own, resumed
    to 12 (in this process: a launch less): TensorBoard and MLflow show each step once, W&B no
    step twice in one run id. (W&B's offline service writes 32 KiB blocks: what the killed
    attempt logged is lost with it, so W&B holds only the resumed attempt's steps from 8 on;
    docs/loggers.md.)"""
    run, out = tmp_path / "run", tmp_path / "out"
    env = dict(job_env(tmp_path), **{k: os.environ[k] for k in _OFFLINE_ENV})
    argv = [sys.executable, str(WORKER), str(run), str(out), "12", "8"]
    killed = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    report = {"report_to": ["tensorboard", "wandb", "mlflow"], "save_steps": 5}
    t = trainer(out, steps=12, callbacks=[CkptDashCallback(run, **FAST)], **report)
    t.train(resume_from_checkpoint=ckptdash.resume_path(run))
    assert t.state.global_step == 12
    wandb.finish()  # W&B writes its offline file in 32 KiB blocks: the rest at finish

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
    # the resumed attempt's: the killed one never has one
    wait_until(lambda: any(map(wandb_offline.closed, offline_runs)), 60, "W&B's exit record")
    logged = [s for s, _ in wandb_offline.logged(offline_runs, "train/global_step", "train/loss")]
    assert len(logged) == len(set(logged)) and set(range(8, 13)) <= set(logged), logged
    state = load_state(run)
    assert state.loggers["wandb"].redone == state.loggers["mlflow"].redone == "dropped"
    assert (state.loggers["mlflow"].attempt, state.loggers["mlflow"].step) == (1, 5)


@pytest.fixture
def shared_wandb_service(offline: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every launch inherits ``WANDB_SERVICE``: the W&B service of a launcher process, as the
    workers of a launcher that called ``wandb.setup()`` do (see test_lightning_loggers)."""
    env = dict(os.environ)
    env.pop("WANDB_SERVICE", None)
    with launcher_service(env) as token:
        monkeypatch.setenv("WANDB_SERVICE", token)  # job_env passes it on
        yield


def test_two_ranks_report_once_into_one_run_across_a_requeue_and_a_kill(
    tmp_path: Path, shared_wandb_service: None
) -> None:
    """torchrun x2 (gloo), three launches: SIGUSR2 to rank 1 alone at step 3 (both ranks save
    the same checkpoint-N, with both ranks' RNG files in its manifest, requeue once, stop there
    and end train() normally), then killed without warning (agent and both ranks) at step 13
    after the save at 10, then to 15, both ranks resuming together each time. TensorBoard:
    every step once, each with the value of the attempt that ran it last; MLflow: one run,
    every step once (the killed attempt's kept); W&B: one run id, no step twice; only rank 0
    wrote logger files and recorded logger runs. The launches inherit a launcher's W&B
    service: in each later attempt rank 0 alone leaves it, and says so once."""
    run, out = tmp_path / "run", tmp_path / "out"
    rank0, rank1, starts = [], [], []
    for restart, options in enumerate([["--signal-at", "3"], ["13"], []]):
        output = torchrun2(
            tmp_path, f"launch{restart}", WORKER, str(run), str(out), "15", *options,
            "--tag", str(restart), slurm_restart=restart, killed=restart == 1,
        )  # fmt: skip
        assert output.count(_OWN_SERVICE) == (0 if restart == 0 else 1), output[-6000:]
        for pids, pid in zip((rank0, rank1), rank_pids(run), strict=True):
            pids.append(pid)
        starts.append({Path(f"{run}.start{r}").read_text() for r in (0, 1)})
        if restart == 0:
            ends = {Path(f"{run}.done{r}").read_text() for r in (0, 1)}
            (ckpt,) = [c for c in load_state(run).checkpoints.values() if c.trigger == "signal"]
            assert ckptdash.resume_path(run) == ckpt.path
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    saved = ckpt.step
    assert saved is not None and 3 <= saved < 10 and ends == {str(saved)}
    listed = {e.path for e in manifest.read(ckpt.path)[0].files}
    assert {"rng_state_0.pth", "rng_state_1.pth", "optimizer.pt"} <= listed
    state = load_state(run)
    assert [(s.rank, s.signal) for s in state.signals] == [(1, "SIGUSR2")]
    assert starts == [{"0"}, {str(saved)}, {"10"}]
    assert {Path(f"{run}.done{r}").read_text() for r in (0, 1)} == {"15"}
    assert state.attempts[1].resumed_from == ckpt.path
    by_path = {c.path: c.step for c in state.checkpoints.values()}
    assert by_path[str(state.attempts[2].resumed_from)] == 10
    assert (state.attempts[2].outcome, state.attempts[2].step) == ("finished", 15)

    def tag(step: int, killed_kept_through: int) -> float:
        return 0.0 if step <= saved else 1.0 if step <= killed_kept_through else 2.0

    derived = f"ckptdash-{RunDir(run).info().run_id}"
    folder = run / "tensorboard" / derived
    files = sorted(folder.glob("events.out.tfevents.*"))
    assert len(files) == 5, files  # a writer per attempt, ckptdash's purge mark in the later two
    assert {tensorboard_pid(f) for f in files} == set(rank0)
    acc = event_accumulator.EventAccumulator(str(folder))
    acc.Reload()
    rows = [(e.step, e.value) for e in acc.Scalars("train/tag")]
    assert rows == [(s, tag(s, 10)) for s in range(1, 16)], rows

    client = mlflow.MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    (ml_run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    history = [(int(m.step), m.value) for m in client.get_metric_history(ml_run.info.run_id, "tag")]
    assert sorted(s for s, _ in history) == list(range(1, 16)), "MLflow: each step once"
    # Appends only: the steps the killed attempt logged (through 12: it was seen at 13, which
    # the Trainer logs after the hook that killed it) keep its values.
    assert dict(history) == {s: tag(s, 12) for s in range(1, 16)}

    offline_runs = sorted((tmp_path / "wandb-home" / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 3 and all(p.name.endswith(derived) for p in offline_runs)
    assert {wandb_pid(p) for p in offline_runs} == set(rank0)
    rows = wandb_offline.logged(offline_runs, "train/global_step", "train/tag")
    steps = [s for s, _ in rows]
    assert len(steps) == len(set(steps)), f"W&B: a step logged twice: {sorted(steps)}"
    assert all(v == tag(s, 12) for s, v in rows), rows
    # The killed attempt may have lost what W&B had not written yet (docs/loggers.md).
    assert set(range(1, saved + 1)) | set(range(13, 16)) <= set(steps), sorted(steps)

    events = attached(run)
    assert len(events) == 9 and {e.rank for e in events} == {0}  # 3 loggers x 3 attempts
    assert not set(rank1) & set(rank0)
