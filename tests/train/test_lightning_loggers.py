"""Lightning's loggers continue one run across preemptions: real TensorBoard, CSV, W&B (offline)
and MLflow (a local file store), across a SIGKILL without warning and a SIGUSR2 save-and-requeue.

Each launch runs ``logger_worker.py`` as its own program, as a user runs a training script;
the curves are read back with each logger's own reader (TensorBoard's ``EventAccumulator``,
MLflow's client, the CSV file, W&B's offline run folders).
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckptdash.rundir import RunDir
from tests.train.helpers import next_wall_second, state_of
from tests.train.test_distributed import job_env
from tests.wandb_launcher import launcher_service
from tests.wandb_offline import logged

pytest.importorskip("lightning.pytorch", reason="install the lightning extra: make test")
event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="install the test extra (tensorboard, wandb, mlflow): make test",
)
pytest.importorskip("wandb", reason="install the test extra: make test")
mlflow = pytest.importorskip("mlflow", reason="install the test extra: make test")

pytestmark = pytest.mark.integration

WORKER = Path(__file__).with_name("logger_worker.py")
TIMEOUT_S = 180.0


class Job:
    """The launches of one run directory, each a new attempt of the same run."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.run, self.logs = tmp_path / "run", tmp_path / "logs"
        self.launches = 0
        self.last_start = 0.0

    def launch(self, *options: str, devices: int = 1) -> subprocess.CompletedProcess[bytes]:
        """One attempt: a (fake) SLURM job 4242 at its next restart count."""
        next_wall_second(self.last_start)  # W&B: one offline folder per attempt
        self.last_start = time.time()
        env = job_env(self.tmp, slurm_restart=self.launches)
        env.update(
            WANDB_MODE="offline",
            WANDB_DIR=str(self.tmp / "wandb-home"),
            WANDB_SILENT="true",
            MLFLOW_ALLOW_FILE_STORE="true",  # the file store is what this test asks for
        )
        argv = [sys.executable, str(WORKER), str(self.run), str(self.logs)]
        argv += [str(self.tmp / f"report{self.launches}.json"), "--tag", str(self.launches)]
        argv += ["--devices", str(devices), *options]
        self.launches += 1
        log = self.tmp / f"launch{self.launches}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, env=env, cwd=self.tmp, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            try:
                proc.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                pytest.fail(f"launch hung:\n{log.read_text(errors='replace')[-4000:]}")
        return subprocess.CompletedProcess(argv, proc.returncode, log.read_bytes())

    def resume_steps(self) -> list[int]:
        """The step each resumed attempt continued from, in attempt order."""
        state = state_of(self.run)
        out = []
        for n in sorted(state.attempts)[1:]:
            (resumed,) = [c for c in state.checkpoints.values() if c.path == _resumed(state, n)]
            assert resumed.step is not None
            out.append(resumed.step)
        return out


def _resumed(state: Any, attempt: int) -> str:
    path = state.attempts[attempt].resumed_from
    assert path, f"attempt {attempt} did not resume"
    return str(path)


def _expected_tags(steps: int, resumes: list[int]) -> dict[int, float]:
    """Which launch's value each step should show when redone steps are replaced."""
    out = {}
    for step in range(steps):
        out[step] = float(sum(1 for r in resumes if step >= r))
    return out


def _tensorboard_tags(folder: Path) -> list[tuple[int, float]]:
    acc = event_accumulator.EventAccumulator(str(folder))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars("tag")]


def _csv_tags(folder: Path) -> list[tuple[int, float]]:
    with (folder / "metrics.csv").open(newline="") as f:
        return [(int(r["step"]), float(r["tag"])) for r in csv.DictReader(f) if r.get("tag")]


def _check_replaced(rows: list[tuple[int, float]], expected: dict[int, float], what: str) -> None:
    steps = [s for s, _ in rows]
    assert len(steps) == len(set(steps)), f"{what}: a step is logged twice: {sorted(steps)}"
    assert dict(rows) == expected, f"{what}: {rows}"


def _only_folder(parent: Path) -> Path:
    (folder,) = list(parent.iterdir())
    return folder


@pytest.fixture(autouse=True)
def _file_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for an opt-in


@pytest.fixture
def shared_wandb_service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every launch inherits ``WANDB_SERVICE``: the W&B service of a launcher process, as a
    launcher that called ``wandb.setup()`` and restarts its workers passes it on. It keeps a
    killed attempt's run open: without ckptdash the next attempt's ``wandb.init`` of the same
    id is refused ("run ID ... is in use"; test_wandb_service pins that)."""
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true")
    env.pop("WANDB_SERVICE", None)
    with launcher_service(env) as token:
        monkeypatch.setenv("WANDB_SERVICE", token)  # job_env passes it on
        yield


def _wandb_rows(job: Job, derived: str, launches: int) -> list[tuple[int, float]]:
    """(trainer/global_step, tag) of every W&B row the launches wrote, read back from the
    offline ``.wandb`` files with wandb's protobuf records; checks one run id throughout."""
    folders = sorted((job.logs / "wandb").glob("offline-run-*"))
    assert len(folders) == launches and all(p.name.endswith(f"-{derived}") for p in folders)
    return [(int(s), float(v)) for s, v in logged(folders, "trainer/global_step", "tag")]


def test_every_attempt_logs_into_one_run_of_each_logger_across_kill_and_requeue(
    tmp_path: Path, shared_wandb_service: None
) -> None:
    """Killed without warning at step 25 (saved at 20), then SIGUSR2 at step 37 (saved there,
    requeued), then run to the end: TensorBoard and CSV hold one folder with every step once,
    the redone steps with the last attempt's values; MLflow one run without a step twice; W&B
    one run id in every attempt (resumed though the killed attempt left it open in a shared
    W&B service), no step twice; ``ckptdash status`` names each logger run."""
    job = Job(tmp_path)
    loggers = ("--loggers", "tensorboard,csv,wandb,mlflow")
    killed = job.launch("--kill-at", "25", "--step-s", "0.01", *loggers)
    assert killed.returncode == -signal.SIGKILL, killed.stdout.decode()[-3000:]
    signalled = job.launch("--signal-at", "37", *loggers)
    assert signalled.returncode == 0, signalled.stdout.decode()[-3000:]
    finished = job.launch(*loggers)
    assert finished.returncode == 0, finished.stdout.decode()[-3000:]
    assert json.loads((tmp_path / "report2.json").read_text())["global_step"] == 50
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]

    resumes = job.resume_steps()
    assert resumes[0] == 20 and resumes[1] > 37, resumes
    expected = _expected_tags(50, resumes)
    run_id = RunDir(job.run).info().run_id
    derived = f"ckptdash-{run_id}"

    tb = _only_folder(job.logs / "tb" / "lightning_logs")
    assert tb.name == derived
    assert len(list(tb.glob("events.out.tfevents.*"))) == 3  # one file per attempt
    _check_replaced(_tensorboard_tags(tb), expected, "TensorBoard")

    csv_folder = _only_folder(job.logs / "csv" / "lightning_logs")
    assert csv_folder.name == derived
    _check_replaced(_csv_tags(csv_folder), expected, "CSV")

    client = mlflow.MlflowClient(f"file:{job.logs / 'mlruns'}")
    (run,) = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
    history = [(int(m.step), m.value) for m in client.get_metric_history(run.info.run_id, "tag")]
    steps = sorted(s for s, _ in history)
    assert steps == list(range(50)), "MLflow: every step once (redone ones not sent again)"
    # Appends only: the steps the killed attempt had logged keep its values.
    assert dict(history)[24] == 0.0 and dict(history)[resumes[1]] == 2.0

    rows = _wandb_rows(job, derived, 3)
    steps = [s for s, _ in rows]
    assert len(steps) == len(set(steps)), f"W&B: a step is logged twice: {sorted(steps)}"
    # The attempts after the kill log every step from where the killed one was seen on (its
    # service, still open, writes the earlier rows when it ends; see docs/loggers.md).
    later = {s: v for s, v in rows if v > 0}
    assert sorted(later) == list(range(min(later), 50)) and min(later) <= 26, sorted(later)
    assert all(v == (1.0 if s < resumes[1] else 2.0) for s, v in later.items()), later

    state = state_of(job.run)
    assert set(state.loggers) == {"tensorboard", "csv", "wandb", "mlflow"}
    assert state.loggers["wandb"].id == derived
    assert state.loggers["mlflow"].id == run.info.run_id
    assert state.loggers["tensorboard"].location == str(tb)
    tb_record = state.loggers["tensorboard"]
    assert (tb_record.attempt, tb_record.step, tb_record.redone) == (2, resumes[1], "replaced")
    status = subprocess.run(
        [sys.executable, "-m", "ckptdash", "status", str(job.run)],
        capture_output=True, text=True, check=True, env=job_env(tmp_path),
    ).stdout  # fmt: skip
    assert f"logger  tensorboard {derived} in {tb}" in status
    assert f"logger  mlflow {run.info.run_id}" in status


def test_two_ranks_log_once_into_one_run(tmp_path: Path) -> None:
    """Two gloo ranks, SIGUSR2 save-and-requeue at step 15, then to the end: only rank 0
    talks to the loggers (one TensorBoard event file and one W&B run folder per attempt, one
    MLflow run, every step once, in W&B too) and records them."""
    job = Job(tmp_path)
    loggers = ("--loggers", "tensorboard,wandb,mlflow", "--steps", "30")
    first = job.launch("--signal-at", "15", *loggers, devices=2)
    assert first.returncode == 0, first.stdout.decode()[-3000:]
    second = job.launch(*loggers, devices=2)
    assert second.returncode == 0, second.stdout.decode()[-3000:]
    (resume,) = job.resume_steps()
    expected = _expected_tags(30, [resume])

    tb = _only_folder(job.logs / "tb" / "lightning_logs")
    assert len(list(tb.glob("events.out.tfevents.*"))) == 2
    _check_replaced(_tensorboard_tags(tb), expected, "TensorBoard")
    client = mlflow.MlflowClient(f"file:{job.logs / 'mlruns'}")
    (run,) = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
    steps = sorted(int(m.step) for m in client.get_metric_history(run.info.run_id, "tag"))
    assert steps == list(range(30))
    rows = _wandb_rows(job, f"ckptdash-{RunDir(job.run).info().run_id}", 2)
    assert sorted(s for s, _ in rows) == list(range(30)), "W&B: every step once"
    state = state_of(job.run)
    assert set(state.loggers) == {"tensorboard", "wandb", "mlflow"}
    assert state.event_counts["logger_attached"] == 6  # 3 loggers x 2 attempts, rank 0 only


def test_a_version_the_user_named_is_kept_and_a_clash_is_told(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A TensorBoardLogger given ``version=`` keeps it (ckptdash names only unnamed loggers);
    when earlier attempts of the run logged into another version, one line on stderr says so,
    and the run's record names the user's version."""
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import TensorBoardLogger

    from tests.train.test_lightning import Tiny, callback

    def fit(steps: int, logger: Any) -> None:
        pl.Trainer(
            default_root_dir=run, max_steps=steps, callbacks=[callback(run)], logger=logger,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            accelerator="cpu",
        ).fit(Tiny())  # fmt: skip

    run = tmp_path / "run"
    first = TensorBoardLogger(tmp_path / "tb")
    fit(3, first)
    derived = f"ckptdash-{RunDir(run).info().run_id}"
    assert first.version == derived
    capfd.readouterr()

    mine = TensorBoardLogger(tmp_path / "tb", version="mine")
    fit(6, mine)
    assert Path(mine.log_dir).name == "mine"
    err = capfd.readouterr().err
    assert "tensorboard logs into 'mine' as you set it; earlier attempts of this run" in err
    assert f"logged into '{derived}'" in err
    record = state_of(run).loggers["tensorboard"]
    assert (record.id, record.named) == ("mine", True)


def test_lightnings_default_logger_under_slurm_continues_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Trainer(logger=True)`` under SLURM versions its TensorBoardLogger by the job id, a
    new folder per resubmitted job and not the user's choice: ckptdash names it after the
    run, and says nothing of a clash."""
    import lightning.pytorch as pl

    from tests.train.test_lightning import Tiny, callback

    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    run = tmp_path / "run"
    t = pl.Trainer(
        default_root_dir=run, max_steps=2, callbacks=[callback(run)], logger=True,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        accelerator="cpu",
    )  # fmt: skip
    t.fit(Tiny())
    derived = f"ckptdash-{RunDir(run).info().run_id}"
    assert Path(t.logger.log_dir) == run / "lightning_logs" / derived
    assert not state_of(run).loggers["tensorboard"].named
