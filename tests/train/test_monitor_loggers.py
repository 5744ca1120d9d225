"""A plain-PyTorch loop opens its own loggers with ``Monitor.loggers``: real TensorBoard, W&B
(offline) and MLflow (a local file store) continue one run across a crash and a resume."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ckptdash
from tests.frameworks.launch import torchrun2
from tests.logger_files import attached, rank_pids, tensorboard_pid, wandb_pid
from tests.train.helpers import next_wall_second, state_of
from tests.wandb_offline import logged

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="install the test extra (tensorboard, wandb, mlflow): make test",
)
pytest.importorskip("torch.utils.tensorboard")
wandb = pytest.importorskip("wandb", reason="install the test extra: make test")
mlflow = pytest.importorskip("mlflow", reason="install the test extra: make test")
from tests.train.monitor_logger_worker import Crash, attempt  # noqa: E402

WORKER = Path(__file__).with_name("monitor_logger_worker.py")


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """W&B offline in the test's folder whatever W&B did earlier in this process (it reads
    its environment once per process, until ``wandb.teardown()``)."""
    wandb.teardown()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for an opt-in
    for name in ("WANDB_RUN_ID", "WANDB_RESUME", "MLFLOW_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    yield
    wandb.teardown()  # no W&B service of this process for later tests' processes to inherit


def test_a_loop_logs_into_one_run_of_each_logger_across_a_crash(
    tmp_path: Path, offline: Any
) -> None:
    """Saved at step 10, crashed at 13, resumed: TensorBoard shows every step once (11 and 12
    from the second attempt), MLflow one run and W&B one run id, each with every step once
    (W&B's read back from its offline ``.wandb`` files)."""
    run, logs = tmp_path / "run", tmp_path / "logs"
    with pytest.raises(Crash):
        attempt(run, logs, tag=0.0, crash_at=13)
    # W&B: one offline folder per attempt. The first attempt's W&B run started after the
    # test did (in the same second, on a fast machine): wait out the second it ended in.
    next_wall_second(time.time())
    attempt(run, logs, tag=1.0)

    run_id = ckptdash.rundir.RunDir(run).info().run_id
    (folder,) = list((logs / "tb").iterdir())
    assert folder.name == f"ckptdash-{run_id}"
    acc = event_accumulator.EventAccumulator(str(folder))
    acc.Reload()
    rows = [(e.step, e.value) for e in acc.Scalars("tag")]
    assert rows == [(s, 0.0 if s <= 10 else 1.0) for s in range(20)]

    client = mlflow.MlflowClient(f"file:{logs / 'mlruns'}")
    (ml_run,) = client.search_runs([client.get_experiment_by_name("Default").experiment_id])
    history = {int(m.step): m.value for m in client.get_metric_history(ml_run.info.run_id, "tag")}
    assert sorted(history) == list(range(20))
    assert history[12] == 0.0 and history[13] == 1.0  # appended only: kept the first values

    offline_runs = sorted((logs / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 2 and all(
        p.name.endswith(f"ckptdash-{run_id}") for p in offline_runs
    )
    rows = logged(offline_runs, "step", "tag")
    assert sorted(s for s, _ in rows) == list(range(20)), f"W&B: each step once: {rows}"
    assert dict(rows)[12] == 0.0 and dict(rows)[13] == 1.0  # the dropped ones kept theirs
    state = state_of(run)
    assert {n: i.id for n, i in state.loggers.items()} == {
        "tensorboard": f"ckptdash-{run_id}",
        "wandb": f"ckptdash-{run_id}",
        "mlflow": ml_run.info.run_id,
    }
    assert state.loggers["tensorboard"].redone == "replaced"
    assert state.loggers["wandb"].redone == "dropped"
    assert os.path.samefile(state.loggers["tensorboard"].location, folder)


def test_a_loop_logs_into_one_run_of_each_logger_across_a_sigusr2_save(
    tmp_path: Path, offline: Any
) -> None:
    """One process: SIGUSR2 after step 7 (ckptdash saves at the step boundary and stops the
    loop), then the next attempt resumes from that save: every logger holds one run, every
    step once, the steps before the save from the first attempt and after it from the next."""
    run, logs = tmp_path / "run", tmp_path / "logs"
    attempt(run, logs, tag=0.0, signal_at=7)
    state = state_of(run)
    (signalled,) = [c for c in state.checkpoints.values() if c.trigger == "signal"]
    saved = signalled.step
    assert saved is not None and 7 <= saved < 10, saved
    # W&B: one offline folder per attempt. The first attempt's W&B run started after the
    # test did (in the same second, on a fast machine): wait out the second it ended in.
    next_wall_second(time.time())
    attempt(run, logs, tag=1.0)

    run_id = ckptdash.rundir.RunDir(run).info().run_id
    (folder,) = list((logs / "tb").iterdir())
    acc = event_accumulator.EventAccumulator(str(folder))
    acc.Reload()
    rows = [(e.step, e.value) for e in acc.Scalars("tag")]
    assert rows == [(s, 0.0 if s <= saved else 1.0) for s in range(20)], rows
    client = mlflow.MlflowClient(f"file:{logs / 'mlruns'}")
    (ml_run,) = client.search_runs([client.get_experiment_by_name("Default").experiment_id])
    history = {int(m.step): m.value for m in client.get_metric_history(ml_run.info.run_id, "tag")}
    assert history == {s: 0.0 if s <= saved else 1.0 for s in range(20)}
    offline_runs = sorted((logs / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 2
    assert all(p.name.endswith(f"ckptdash-{run_id}") for p in offline_runs)
    wb_rows = logged(offline_runs, "step", "tag")
    assert sorted(s for s, _ in wb_rows) == list(range(20)), f"W&B: each step once: {wb_rows}"
    resumed = state_of(run).attempts[1].resumed_from
    assert resumed is not None and os.path.samefile(resumed, signalled.path)


def test_two_ranks_continue_one_run_across_a_requeue_and_a_kill(
    tmp_path: Path, offline: Any
) -> None:
    """Two gloo ranks under torchrun, three launches: SIGUSR2 to rank 1 at step 3 (saved
    there, requeued), then killed without warning at step 13 (saved at 10), then to the end.
    TensorBoard: one folder, every step once, each with the value of the attempt that ran it
    last; MLflow: one run, every step once (the killed attempt's kept); W&B: one run id, no
    step twice; only rank 0 wrote logger files and recorded logger runs."""
    run, logs = tmp_path / "run", tmp_path / "logs"
    rank0, rank1 = [], []

    def launch(restart: int, *options: str, killed: bool = False) -> None:
        torchrun2(
            tmp_path, f"launch{restart}", WORKER, str(run), str(logs), str(restart), *options,
            slurm_restart=restart, killed=killed,
        )  # fmt: skip
        pids = rank_pids(run)
        rank0.append(pids[0])
        rank1.append(pids[1])

    launch(0, "--signal-at", "3")
    launch(1, "--kill-at", "13", killed=True)
    launch(2)
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    state = state_of(run)
    signalled = [c for c in state.checkpoints.values() if c.trigger == "signal"]
    (saved,) = [c.step for c in signalled]
    assert saved is not None and 3 <= saved < 10
    by_path = {c.path: c.step for c in state.checkpoints.values()}
    resumed = [by_path[str(state.attempts[n].resumed_from)] for n in (1, 2)]
    assert resumed == [saved, 10], resumed

    run_id = ckptdash.rundir.RunDir(run).info().run_id
    (folder,) = list((logs / "tb").iterdir())
    assert folder.name == f"ckptdash-{run_id}"
    files = sorted(folder.glob("events.out.tfevents.*"))
    assert len(files) == 3 and {tensorboard_pid(f) for f in files} <= set(rank0), files
    acc = event_accumulator.EventAccumulator(str(folder))
    acc.Reload()
    rows = [(e.step, e.value) for e in acc.Scalars("tag")]
    assert rows == [(s, 0.0 if s <= saved else 1.0 if s <= 10 else 2.0) for s in range(20)]

    client = mlflow.MlflowClient(f"file:{logs / 'mlruns'}")
    (ml_run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    history = [(int(m.step), m.value) for m in client.get_metric_history(ml_run.info.run_id, "tag")]
    assert sorted(s for s, _ in history) == list(range(20)), "MLflow: each step once"
    # Appends only: the steps the killed attempt logged (through 12, where it was seen) keep
    # its values.
    assert dict(history) == {s: 0.0 if s <= saved else 1.0 if s <= 12 else 2.0 for s in range(20)}

    offline_runs = sorted((logs / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 3 and all(
        p.name.endswith(f"ckptdash-{run_id}") for p in offline_runs
    )
    assert {wandb_pid(p) for p in offline_runs} == set(rank0)
    wb = logged(offline_runs, "step", "tag")
    steps = [s for s, _ in wb]
    assert len(steps) == len(set(steps)), f"W&B: a step logged twice: {sorted(steps)}"
    # The requeued attempt finished its W&B run; the killed one may have lost what W&B had not
    # written yet (docs/loggers.md); the last logs from where the killed one was seen on.
    expected = {s: 0.0 if s <= saved else 1.0 if s <= 12 else 2.0 for s in range(20)}
    assert all(expected[s] == v for s, v in wb), wb
    assert set(range(saved + 1)) | set(range(13, 20)) <= set(steps), sorted(steps)

    events = attached(run)
    assert len(events) == 9 and {e.rank for e in events} == {0}  # 3 loggers x 3 attempts
    assert not set(rank1) & ({tensorboard_pid(f) for f in files} | set(rank0))
