"""Real 2-rank torch.distributed jobs (gloo, CPU) launched with torchrun: the ranks agree.

Each test launches ``tests/train/dist_worker.py`` as its own program under
``python -m torch.distributed.run --nproc-per-node=2``; every rank reports the steps it ran
and saved at in a JSON file, and the run directory's events are replayed with ``load_state``.
A launch that hangs is killed (the torchrun agent and both ranks) and fails the test.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from ckptdash import control
from ckptdash.resume import check_checkpoint
from ckptdash.rundir import manifest
from ckptdash.state import RunState
from ckptdash.state.reading import load_state
from tests.conftest import WaitUntil
from tests.train.helpers import fake_scontrol, slurm_env

pytestmark = pytest.mark.integration

WORKER = Path(__file__).with_name("dist_worker.py")
REPO_ROOT = Path(__file__).resolve().parents[2]
LAUNCH_TIMEOUT_S = 90.0
# The worker's steps take >= 5 ms and it agrees every 0.05 s, so two checks are at most
# 10 steps apart: a request is acted on within that many steps of its arrival.
MAX_CHECK_GAP = 10
SIGNAL_AT = 12
STEPS = 60  # well past SIGNAL_AT + MAX_CHECK_GAP: a signal stop is an early stop
_LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")
_LAUNCHER_VARS += ("MASTER_ADDR", "MASTER_PORT")
# What ckptdash's HF hook sets for the Trainer's loggers: an in-process HF test before must not
# hand its run's W&B / MLflow id to another test's jobs.
_LAUNCHER_VARS += ("WANDB_RUN_ID", "WANDB_RESUME", "MLFLOW_RUN_ID", "TENSORBOARD_LOGGING_DIR")


class JobEnv(dict[str, str]):
    """The environment of one launch; ``helpers.slurm_env`` fills it like a monkeypatch."""

    def setenv(self, name: str, value: str) -> None:
        self[name] = value


def job_env(tmp_path: Path, *, slurm_restart: int | None = None) -> JobEnv:
    """This environment minus inherited launcher/SLURM/ckptdash variables; optionally a fake
    SLURM job (id 4242) whose ``scontrol`` appends its arguments to ``tmp_path/scontrol.log``."""
    env = JobEnv(
        (k, v)
        for k, v in os.environ.items()
        if k not in _LAUNCHER_VARS and not k.startswith(("SLURM_", "CKPTDASH_", "TORCHELASTIC_"))
    )
    # The worker runs as a script: make this checkout's ckptdash importable whatever the install.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = "1"
    if slurm_restart is not None:
        fake_scontrol(tmp_path / "bin", tmp_path / "scontrol.log")
        slurm_env(env, tmp_path / "bin", restart=slurm_restart)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Job:
    """One torchrun launch of the worker with 2 ranks; its output goes to a log file."""

    def __init__(self, tmp_path: Path, name: str, env: JobEnv, worker_args: list[str]) -> None:
        self.reports = tmp_path / f"{name}-ranks"
        self.log = tmp_path / f"{name}.log"
        self.ready = self.reports / "ready"
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2"]
        argv += ["--master-addr=127.0.0.1", f"--master-port={_free_port()}", str(WORKER)]
        argv += [worker_args[0], worker_args[1], str(self.reports), *worker_args[2:]]
        with self.log.open("wb") as out:
            # Own session: on a hang the agent and both ranks are killed together.
            self.proc = subprocess.Popen(
                argv, env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def wait(self, timeout: float = LAUNCH_TIMEOUT_S) -> list[dict[str, Any]]:
        """Wait for the job; fail on a hang or a non-zero exit; return rank 0's and 1's reports."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"torchrun job hung for {timeout} s and was killed:\n{self.output()}")
        assert rc == 0, f"torchrun exited {rc}:\n{self.output()}"
        return [json.loads((self.reports / f"rank{r}.json").read_text()) for r in (0, 1)]

    def kill(self) -> None:
        """Kill a job still running: both ranks (by the pids they wrote), then the agent's group."""
        if self.proc.poll() is not None:
            return  # torchrun waited for both ranks before it exited
        for pid_file in self.reports.glob("rank*.pid"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Any]:
    """``launch(name, env, mode, run_dir, *options)`` starts a Job; any still running at the end
    of the test is killed."""
    jobs: list[Job] = []

    def start(name: str, env: JobEnv, mode: str, run: Path, *options: str) -> Job:
        job = Job(tmp_path, name, env, [mode, str(run), *options])
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.kill()


@dataclass
class Preempted:
    """A finished launch, as it was right after it ended (later tests may add to ``run``)."""

    root: Path
    run: Path
    ranks: list[dict[str, Any]]
    state: RunState
    scontrol_calls: list[str]


@pytest.fixture(scope="module")
def preempted(tmp_path_factory: pytest.TempPathFactory) -> Preempted:
    """One launch (attempt 0 of fake SLURM job 4242) in which rank 1 alone sends itself SIGUSR2
    after step SIGNAL_AT. Shared by the signal and the resume test to save a launch."""
    root = tmp_path_factory.mktemp("preempted")
    run = root / "run"
    job = Job(
        root, "signal", job_env(root, slurm_restart=0),
        ["monitor", str(run), f"--steps={STEPS}", f"--signal-at={SIGNAL_AT}"],
    )  # fmt: skip
    try:
        ranks = job.wait()
    finally:
        job.kill()
    calls = (root / "scontrol.log").read_text().splitlines()
    return Preempted(root, run, ranks, load_state(run), calls)


def test_signal_to_one_rank_saves_same_step_on_both_requeues_once_and_stops(
    preempted: Preempted,
) -> None:
    """SIGUSR2 delivered to rank 1 only → at the next agreement both ranks decide to save at the
    same step, rank 0 writes the one signal checkpoint, only rank 0 requeues (one scontrol call),
    both ranks stop there, and the log shows the signal as received by rank 1 alone."""
    r0, r1 = preempted.ranks
    assert r0["saves"] == r1["saves"]
    (saved,) = r0["saves"]
    assert SIGNAL_AT <= saved <= SIGNAL_AT + MAX_CHECK_GAP
    assert r0["last"] == r1["last"] == saved  # no step run after the save, on either rank
    assert r0["stopped"] and r1["stopped"]
    assert preempted.scontrol_calls == ["requeue 4242"]

    state = preempted.state
    (ckpt,) = state.checkpoints.values()
    assert (ckpt.trigger, ckpt.step, ckpt.status, ckpt.rank) == ("signal", saved, "saved", 0)
    assert torch.load(ckpt.path, weights_only=False)["step"] == saved
    assert [(s.rank, s.signal, s.action, s.step) for s in state.signals] == [
        (1, "SIGUSR2", "requeue", saved)
    ]
    assert [(q.issued, q.rank, q.job_id) for q in state.requeues] == [(True, 0, "4242")]
    attempt = state.attempts[0]
    assert (attempt.outcome, attempt.end_reason, attempt.world_size) == ("stopped", "preempted", 2)
    assert attempt.ranks == [0, 1]


def test_save_now_while_both_ranks_train_saves_same_step_once_and_continues(
    tmp_path: Path, launch: Any, wait_until: WaitUntil
) -> None:
    """A save_now put in the inbox by another process while both ranks train → both ranks save
    at the same step (rank 0 writes it), the command is applied exactly once with that checkpoint's
    path, and both ranks train on to the last step."""
    run, gate = tmp_path / "run", 10
    job = launch(
        "save-now", job_env(tmp_path), "monitor", run, f"--steps={STEPS}", f"--gate-at={gate}"
    )
    wait_until(lambda: job.ready.exists() or job.proc.poll() is not None, timeout=LAUNCH_TIMEOUT_S)
    assert job.proc.poll() is None, job.output()
    cmd = control.issue(run, "save_now", author="test")
    r0, r1 = job.wait()

    assert r0["saves"] == r1["saves"]
    (saved,) = r0["saves"]
    assert gate <= saved <= gate + MAX_CHECK_GAP
    assert r0["last"] == r1["last"] == STEPS - 1
    assert not r0["stopped"] and not r1["stopped"]

    state = load_state(run)
    (ckpt,) = state.checkpoints.values()
    assert (ckpt.trigger, ckpt.step, ckpt.status) == ("manual", saved, "saved")
    answer = state.commands[cmd.id]
    assert (answer.status, answer.detail) == ("applied", ckpt.path)
    assert state.event_counts.get("command_applied") == 1
    assert control.pending(run) == []
    assert state.attempts[0].outcome == "finished"


def test_second_launch_resumes_both_ranks_from_the_same_checkpoint_at_the_next_step(
    preempted: Preempted, launch: Any
) -> None:
    """After a signal save and requeue, the next launch applies the resume rule once and both
    ranks load that checkpoint (their weights equal the file's before DDP syncs anything) and
    start at the step after it, then run to the end; the run records the resume."""
    (saved,) = preempted.ranks[0]["saves"]
    (ckpt,) = preempted.state.checkpoints.values()
    env = job_env(preempted.root, slurm_restart=1)
    ranks = launch("second", env, "monitor", preempted.run, f"--steps={STEPS}").wait()

    weights = torch.load(ckpt.path, weights_only=False)["model"]
    expected_sum = float(sum(t.double().sum() for t in weights.values()))
    assert expected_sum != pytest.approx(preempted.ranks[1]["param_sum_at_start"])  # trained
    for r in ranks:
        assert r["attempt"] == 1
        assert r["loaded"] == ckpt.path
        assert r["start"] == saved + 1
        assert r["last"] == STEPS - 1
        assert r["saves"] == []
        assert r["param_sum_at_start"] == pytest.approx(expected_sum, abs=1e-6)
    state = load_state(preempted.run)
    assert state.attempts[1].resumed_from == ckpt.path
    assert state.attempts[1].outcome == "finished"
    assert len(state.requeues) == 1  # the first attempt's; the second finished without a signal
    assert (preempted.root / "scontrol.log").read_text().splitlines() == ["requeue 4242"]


def test_lightning_ddp_signal_to_one_rank_saves_same_step_on_both(
    tmp_path: Path, launch: Any
) -> None:
    """Lightning DDP (CPU, 2 devices) under torchrun with CkptDashCallback: SIGUSR2 on rank 1
    only → both ranks save at the same global step, rank 0 writes the one signal checkpoint and
    requeues once, and fit() ends on both ranks right there."""
    pytest.importorskip("lightning.pytorch", reason="install the lightning extra: make test")
    run = tmp_path / "run"
    env = job_env(tmp_path, slurm_restart=0)
    r0, r1 = launch(
        "lightning", env, "lightning", run, f"--steps={STEPS}", f"--signal-at={SIGNAL_AT}"
    ).wait()

    assert r0["saves"] == r1["saves"]
    (saved,) = r0["saves"]  # the global step after the optimizer step that saw the signal
    assert SIGNAL_AT < saved <= SIGNAL_AT + 1 + MAX_CHECK_GAP
    assert r0["global_step"] == r1["global_step"] == saved
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]

    state = load_state(run)
    (ckpt,) = state.checkpoints.values()
    assert (ckpt.trigger, ckpt.step, ckpt.status, ckpt.rank) == ("signal", saved, "saved", 0)
    assert [(s.rank, s.signal) for s in state.signals] == [(1, "SIGUSR2")]
    assert [(q.issued, q.rank) for q in state.requeues] == [(True, 0)]
    assert (state.attempts[0].outcome, state.attempts[0].end_reason) == ("stopped", "preempted")


def test_lightning_sharded_save_is_one_checkpoint_and_the_next_launch_resumes_from_it(
    tmp_path: Path, launch: Any
) -> None:
    """FSDP2 (ModelParallelStrategy, CPU, 2 ranks) writes each checkpoint as a directory of
    per-rank shards without the CheckpointIO. SIGUSR2 on rank 1 → one `signal` checkpoint:
    the directory, with both ranks' shards in its manifest, saved once by rank 0 and valid
    for resume; the requeued attempt loads it on both ranks and continues at the next step."""
    pytest.importorskip("lightning.pytorch", reason="install the lightning extra: make test")
    run = tmp_path / "run"
    r0, r1 = launch(
        "sharded-0", job_env(tmp_path, slurm_restart=0), "lightning", run,
        f"--steps={STEPS}", f"--signal-at={SIGNAL_AT}", "--sharded",
    ).wait()  # fmt: skip
    assert r0["saves"] == r1["saves"]
    (saved,) = r0["saves"]
    state = load_state(run)
    (ckpt,) = state.checkpoints.values()
    assert (ckpt.trigger, ckpt.step, ckpt.status, ckpt.rank) == ("signal", saved, "saved", 0)
    shards = Path(ckpt.path)
    assert {"__0_0.distcp", "__1_0.distcp"} <= {p.name for p in shards.iterdir()}
    # The manifest rank 0 wrote lists every rank's shard; the record holds its digest.
    listed, digest = manifest.read(shards)
    assert {"__0_0.distcp", "__1_0.distcp"} <= {f.path for f in listed.files}
    assert (ckpt.size_bytes, ckpt.checksum) == (listed.size_bytes, digest)
    assert check_checkpoint(ckpt) is None

    r0, r1 = launch(
        "sharded-1", job_env(tmp_path, slurm_restart=1), "lightning", run,
        f"--steps={STEPS}", "--sharded",
    ).wait()  # fmt: skip
    assert r0["first"] == r1["first"] == saved  # global_step after the saved step: the next one
    assert r0["global_step"] == r1["global_step"] == STEPS
    state = load_state(run)
    assert state.attempts[1].resumed_from == ckpt.path
    assert state.attempts[1].outcome == "finished"


@pytest.mark.parametrize("rank", ["0", "1"])
def test_monitor_before_init_process_group_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rank: str
) -> None:
    """Under a launcher that says several ranks (WORLD_SIZE=2) a Monitor created before
    init_process_group() raises a ConfigError naming the fix and writes nothing, instead of each
    rank deciding alone (a signal on one rank would stop it and hang the others)."""
    import ckptdash
    from ckptdash.train.config import ConfigError

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", rank)
    with pytest.raises(ConfigError, match=r"init_process_group\(\) before creating"):
        ckptdash.Monitor(tmp_path / "run")
    assert not (tmp_path / "run").exists()
