"""A plain-PyTorch loop opens its own loggers with ``Monitor.loggers``: real TensorBoard, W&B
(offline) and MLflow (a local file store) continue one run across a crash and a resume."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptdash
from tests.train.helpers import next_wall_second, state_of
from tests.wandb_offline import logged

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="install the test extra (tensorboard, wandb, mlflow): make test",
)
pytest.importorskip("torch.utils.tensorboard")
wandb = pytest.importorskip("wandb", reason="install the test extra: make test")
mlflow = pytest.importorskip("mlflow", reason="install the test extra: make test")
from torch.utils.tensorboard import SummaryWriter  # noqa: E402


class Crash(RuntimeError):
    pass


def attempt(run: Path, logs: Path, *, tag: float, crash_at: int | None, total: int = 20) -> None:
    """One attempt of a loop that saves every 5 steps and logs ``tag`` at every step to the
    three loggers, opened the documented way; ``crash_at``: raise at that step."""
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ckptdash.Monitor(run, max_steps=total, agree_interval_s=0.001) as monitor:
        state = monitor.load()
        start = 0 if state is None else state["step"] + 1
        if state is not None:
            model.load_state_dict(state["model"])
        tb = SummaryWriter(**monitor.loggers.tensorboard_writer_kwargs(logs / "tb"))
        wb = wandb.init(
            project="exp", dir=str(logs), mode="offline", **monitor.loggers.wandb_init_kwargs()
        )
        mlflow.set_tracking_uri(f"file:{logs / 'mlruns'}")
        ml = mlflow.start_run(run_id=monitor.loggers.mlflow_run_id)
        monitor.loggers.attach("mlflow", ml.info.run_id, mlflow.get_tracking_uri())
        skip_through = monitor.loggers.logged_through
        try:
            for step in range(start, total):
                if step == crash_at:
                    raise Crash(f"boom at {step}")
                loss = model(torch.randn(8, 4)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                tb.add_scalar("tag", tag, step)
                if skip_through is None or step > skip_through:
                    wb.log({"tag": tag, "step": step})
                    mlflow.log_metric("tag", tag, step=step)
                monitor.step(step, loss=loss.item())
                if step % 5 == 0 or monitor.should_save:
                    monitor.save({"model": model.state_dict(), "step": step})
        finally:
            tb.close()
            wb.finish()
            mlflow.end_run()


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
    started = time.time()
    with pytest.raises(Crash):
        attempt(run, logs, tag=0.0, crash_at=13)
    next_wall_second(started)  # W&B: one offline folder per attempt
    attempt(run, logs, tag=1.0, crash_at=None)

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
