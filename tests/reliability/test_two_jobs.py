"""Two jobs on one run directory are refused, never silently mixed.

The Lightning race: two jobs write one run directory (a job array sharing
``run_dir``, a resubmission while the first job still runs) and one resumes the
other's checkpoint. ckptdash's guard refuses the second job at start, naming
both jobs and the fix; a job's own requeued successor and a dead job's
successor start as before.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from ckptdash import Monitor, control
from ckptdash.errors import RunDirError
from ckptdash.events import (
    CheckpointSaved,
    CommandApplied,
    Heartbeat,
    RunFailed,
    RunResumed,
    RunStarted,
)
from ckptdash.rundir import RunDir
from ckptdash.rundir.writer import EventWriter
from ckptdash.schedulers.slurm import SlurmScheduler
from ckptdash.train.engine.session import Session
from ckptdash.train.starting.guard import RunGuard
from tests.reliability import faults
from tests.reliability.conftest import scale


def _other_job(run: Path, *, host: str, pid: int, job_id: str, last_event_age_s: float) -> None:
    """Record an attempt of another job that never ended, last heard of that long ago."""
    w = EventWriter(run, attempt=0, host=host)
    t = time.time() - last_event_age_s
    w.emit(RunStarted, t=t - 1, scheduler="slurm", job_id=job_id, pid=pid)
    w.emit(Heartbeat, t=t, step=5)
    w.close()


def _event_files(run: Path) -> list[str]:
    return sorted(p.name for p in RunDir(run).event_files())


def test_a_second_job_is_refused_while_the_first_runs(tmp_path: Path) -> None:
    """While job A trains, job B on the same run directory raises RunDirError naming A
    (host, pid) and the fix, and leaves no trace: no event file, no event, A's attempt
    still running and its commands still answered. Once A has ended, a new job starts
    and resumes A's checkpoint."""
    run = tmp_path / "run"
    ctx = faults.context()
    ready = ctx.Event()
    job = ctx.Process(target=faults.job_victim, args=(str(run), ready, 0.01, 0.005), daemon=True)
    job.start()
    try:
        faults.wait_for(ready.is_set, 120, "job A to start")
        files = _event_files(run)
        with pytest.raises(RunDirError) as refused:
            Monitor(run, install_signals=False)
        message = str(refused.value)
        assert f"pid {job.pid}" in message and socket.gethostname() in message
        assert "in use by another job" in message and "own run_dir" in message
        assert _event_files(run) == files
        cmd = control.issue(run, "save_now")
        faults.wait_for(
            lambda: cmd.id in {e.command_id for e in faults.Replay.of(run).of_kind(CommandApplied)},
            30,
            "job A to answer a command after the refusal",
        )
        control.issue(run, "stop_after_save")
        job.join(60)
        assert job.exitcode == 0
    finally:
        faults.kill(job)
    replay = faults.Replay.of(run)
    assert [a.outcome for a in replay.state.attempts.values()] == ["stopped"]
    assert not replay.of_kind(RunFailed)
    with Monitor(run, install_signals=False) as monitor:
        assert monitor.load() is not None
        assert monitor.attempt == 1


def test_an_attempt_on_another_host_counts_as_running_until_it_goes_stale(
    tmp_path: Path,
) -> None:
    """An attempt of another job on another host that never recorded its end blocks a new
    job while its last event is newer than ``stale_after_s`` (the message says how long
    ago it was heard of and what to do); once older, the new job starts and the old
    attempt shows as lost."""
    run = tmp_path / "run"
    _other_job(run, host="node99", pid=4242, job_id="111", last_event_age_s=2)
    with pytest.raises(RunDirError) as refused:
        Monitor(run, install_signals=False)
    assert "node99" in str(refused.value) and "stale_after_s" in str(refused.value)
    with Monitor(run, install_signals=False, stale_after_s=1) as monitor:
        assert monitor.attempt == 1
    state = faults.Replay.of(run).state
    assert [state.attempts[n].outcome for n in (0, 1)] == ["lost", "finished"]


def test_a_requeued_job_is_not_refused_by_its_own_predecessor(tmp_path: Path) -> None:
    """SLURM requeue: attempt 0 of job 4242 was killed without an end event a moment ago.
    Attempt 1 of the same job starts (the scheduler runs one instance of a job); a
    different job 4243 is refused."""
    run = tmp_path / "run"
    _other_job(run, host="node99", pid=4242, job_id="4242", last_event_age_s=1)
    other = SlurmScheduler({"SLURM_JOB_ID": "4243", "SLURM_RESTART_COUNT": "0"})
    with pytest.raises(RunDirError, match="job 4242"):
        Monitor(run, install_signals=False, scheduler=other)
    same = SlurmScheduler({"SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "1"})
    with Monitor(run, install_signals=False, scheduler=same) as monitor:
        assert monitor.attempt == 1


def test_a_dead_job_on_this_host_does_not_block(tmp_path: Path) -> None:
    """An attempt on this host whose process is gone (killed, its pid free or reused by a
    younger process) never blocks the next job, however recent its last event."""
    run = tmp_path / "run"
    ctx = faults.context()
    ready = ctx.Event()
    job = ctx.Process(target=faults.job_victim, args=(str(run), ready, 0.01, 0.005), daemon=True)
    job.start()
    faults.wait_for(ready.is_set, 120, "the job to start")
    faults.kill(job)
    with Monitor(run, install_signals=False) as monitor:
        assert monitor.attempt == 1


def test_jobs_starting_at_the_same_moment_one_runs_the_other_gives_way(
    tmp_path: Path, figures: Callable[[str, str], None]
) -> None:
    """Two jobs released by one barrier start on one run directory, 10 rounds (50 long):
    every round exactly one runs and the other raises RunDirError — before writing anything
    when it already sees the first, or, when both wrote ``run_started`` at once, the later
    start records ``run_failed`` ("refused to start") and gives way. Only the winner ever
    saves."""
    ctx = faults.context()
    rounds = scale(10, 50)
    paths = {"before writing": 0, "after run_started": 0}
    for n in range(rounds):
        run = tmp_path / f"run{n}"
        RunDir(run).ensure()
        barrier, finish = ctx.Barrier(2), ctx.Event()
        outs = [tmp_path / f"r{n}-{i}.txt" for i in range(2)]
        procs = [
            ctx.Process(target=faults.contender, args=(str(run), barrier, finish, str(o)))
            for o in outs
        ]
        for p in procs:
            p.start()
        try:
            faults.wait_for(lambda o=outs: all(x.exists() for x in o), 60, "both jobs to start")
        finally:
            finish.set()
            for p in procs:
                p.join(60)
        results = sorted(o.read_text().split("\n", 1)[0] for o in outs)
        assert results == ["refused", "won"], (n, [o.read_text() for o in outs])
        replay = faults.Replay.of(run)
        failed = replay.of_kind(RunFailed)
        paths["after run_started" if failed else "before writing"] += 1
        assert len(failed) == len(replay.of_kind(RunStarted)) - 1
        assert all(f.error.startswith("refused to start") for f in failed)
        winner = next(int(o.read_text().split()[1]) for o in outs if o.read_text()[:3] == "won")
        (saved,) = replay.of_kind(CheckpointSaved)
        assert torch.load(saved.path, weights_only=True)["pid"] == winner
        assert not replay.of_kind(RunResumed)
    figures(
        "two jobs on one run directory",
        f"{rounds} rounds of two jobs started at the same moment: {rounds} refused"
        f" ({paths['before writing']} before writing anything,"
        f" {paths['after run_started']} after both wrote run_started), 0 mixed",
    )
    assert os.path.exists(tmp_path)


@pytest.mark.parametrize("other_started", ["earlier", "later"])
def test_of_two_jobs_that_both_wrote_run_started_the_later_gives_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other_started: str
) -> None:
    """Another job's ``run_started`` lands between this job's first look and its own
    ``run_started`` (both passed the first check). If the other started earlier, this job
    records ``run_failed`` ("refused to start", naming the other) and raises; if later,
    this job runs and the other is the one that gives way."""
    run = tmp_path / "run"
    age = 0.5 if other_started == "earlier" else -5.0  # seconds before (after) our start

    class Racing(RunGuard):
        def __init__(self, session: Session) -> None:
            super().__init__(session)  # the first look saw nobody
            _other_job(run, host="node99", pid=4242, job_id="9", last_event_age_s=age)

    monkeypatch.setattr("ckptdash.train.engine.session.RunGuard", Racing)
    if other_started == "earlier":
        with pytest.raises(RunDirError, match="node99"):
            Monitor(run, install_signals=False)
        (failed,) = faults.Replay.of(run).of_kind(RunFailed)
        assert failed.error.startswith("refused to start") and "pid 4242" in failed.error
    else:
        with Monitor(run, install_signals=False) as monitor:
            assert monitor.session.stop_reason is None
        assert not faults.Replay.of(run).of_kind(RunFailed)


def test_lightning_never_resumes_the_checkpoint_of_a_running_job(tmp_path: Path) -> None:
    """The Lightning race: job A (running) has saved a checkpoint; job B, a Lightning
    Trainer with CkptDashCallback on the same run directory, fails in ``fit()`` with
    RunDirError before it loads anything: no ``run_resumed``, B's weights untouched, A
    unaffected."""
    pytest.importorskip("lightning.pytorch")
    from tests.train.test_lightning import Tiny, callback, trainer

    run = tmp_path / "run"
    ctx = faults.context()
    ready = ctx.Event()
    job = ctx.Process(target=faults.job_victim, args=(str(run), ready, 0.01, 0.005), daemon=True)
    job.start()
    try:
        faults.wait_for(ready.is_set, 120, "job A to start")
        cmd = control.issue(run, "save_now")
        faults.wait_for(
            lambda: cmd.id in {e.command_id for e in faults.Replay.of(run).of_kind(CommandApplied)},
            30,
            "job A to save",
        )
        model = Tiny()
        before = [p.detach().clone() for p in model.parameters()]
        with pytest.raises(RunDirError, match="in use by another job"):
            trainer(run, 5, [callback(run)]).fit(model)
        assert all((a == b).all() for a, b in zip(before, model.parameters(), strict=True))
        replay = faults.Replay.of(run)
        assert not replay.of_kind(RunResumed) and not replay.of_kind(RunFailed)
        assert len(replay.state.attempts) == 1 and job.is_alive()
    finally:
        faults.kill(job)
