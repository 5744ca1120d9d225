"""Real SLURM with other launchers' signal handling in place: Lightning's SLURM auto-requeue
left on (USR1), and submitit.

Each test names a scenario driver (run concurrently with the tier's others, see conftest.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.slurm.harness import REPO_ROOT, Job, Scenario, Scenarios, read_events, scenario

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

STEPS = 400  # x 30 ms: about 12 s of training, long enough to be signalled mid-run
# What Lightning needs to see to detect SLURM and switch its auto-requeue on (USR1).
LIGHTNING_SLURM = ("--ntasks=1", "--requeue", "--signal=B:USR1@5")


def _heartbeat_step(run: Path, attempt: int) -> int:
    steps = [e.step for e in read_events(run) if e.attempt == attempt and e.KIND == "heartbeat"]
    return max((s for s in steps if s is not None), default=-1)


def _preempt(s: Scenario, job: Job, run: Path, signal: str, *, batch: bool = True) -> None:
    s.wait_training(job, 0)
    s.wait(lambda: _heartbeat_step(run, 0) >= 10, "attempt 0 past step 10")
    target = ["--batch"] if batch else []
    s.cluster.run("scancel", *target, f"--signal={signal}", job.job_id)


# --- Lightning's auto-requeue left on ----------------------------------------------------------


def drive_lightning_usr1(s: Scenario) -> dict[str, Any]:
    run = s.root / "run"
    job = s.lightning(run, *LIGHTNING_SLURM, max_steps=STEPS)
    _preempt(s, job, run, "USR1")
    fields = s.wait_done(job)
    return {
        "fields": fields,
        "job": job.job_id,
        "events": read_events(run),
        "reports": [job.report(0), job.report(1)],
        "files": sorted(p.name for p in run.rglob("*.ckpt")),
        "output": job.output.read_text(errors="replace"),
    }


@scenario(drive_lightning_usr1)
def test_lightning_usr1_auto_requeue_is_recorded_and_requeued_once_by_ckptdash(
    scenarios: Scenarios,
) -> None:
    """Lightning's SLURM auto-requeue on (USR1, --ntasks=1): USR1 is recorded, the save happens
    at the step boundary with trigger `signal` (no mid-step hpc_ckpt_N), ckptdash issues the one
    requeue, the next attempt resumes at the next step and completes; the job log has the
    start-up line saying what each signal does."""
    r = scenarios.result(drive_lightning_usr1)
    events = r["events"]
    assert r["fields"]["JobState"] == "COMPLETED" and r["fields"]["Restarts"] == "1"
    signals = [(e.signal, e.action) for e in events if e.KIND == "signal_received"]
    assert signals[0] == ("SIGUSR1", "requeue")
    saves = [e for e in events if e.KIND == "checkpoint_saved"]
    assert [e.trigger for e in saves] == ["signal"]
    assert not [f for f in r["files"] if f.startswith("hpc_ckpt_")]
    assert len([e for e in events if e.KIND == "requeue_issued"]) == 1
    assert r["reports"][1]["first_step"] == saves[0].step
    assert r["reports"][1]["final_step"] == STEPS
    assert "SIGUSR1 -> save at the next step boundary, requeue by ckptdash" in r["output"]
    assert "(replaces Lightning's handler)" in r["output"]


def drive_lightning_usr1_budget(s: Scenario) -> dict[str, Any]:
    run = s.root / "run"
    job = s.lightning(run, *LIGHTNING_SLURM, max_steps=STEPS, max_attempts=1)
    _preempt(s, job, run, "USR1")
    return {"fields": s.wait_done(job), "events": read_events(run)}


@scenario(drive_lightning_usr1_budget)
def test_lightning_usr1_applies_the_requeue_budget(scenarios: Scenarios) -> None:
    """With Lightning's auto-requeue on and a budget of one attempt, USR1 saves and is not
    requeued by anyone: the requeue_skipped event names the budget, SLURM restarts nothing."""
    r = scenarios.result(drive_lightning_usr1_budget)
    assert r["fields"]["Restarts"] == "0"
    kinds = [e.KIND for e in r["events"]]
    assert "requeue_issued" not in kinds
    (skipped,) = [e for e in r["events"] if e.KIND == "requeue_skipped"]
    assert "budget" in skipped.reason


# --- submitit ----------------------------------------------------------------------------------


def _submitit(
    s: Scenario, preempt: Callable[[Any, Job, Path], None], *, wrap: bool = True
) -> dict[str, Any]:
    """Submit submitit_job.train (through preemptible() unless not ``wrap``) with submitit's
    defaults, preempt it once with ``preempt(submitit_job, job, run)``, and wait for its
    result."""
    import submitit

    from ckptdash.submitit import preemptible
    from tests.slurm.jobs import submitit_job

    run, reports = s.root / "run", s.root / "reports"
    os.environ["SLURM_CONF"] = str(s.cluster.conf)  # submitit runs sbatch itself
    executor = submitit.AutoExecutor(folder=s.root / "submitit")
    executor.update_parameters(
        name="ckptdash-submitit",
        timeout_min=10,
        slurm_setup=[f"export PYTHONPATH={REPO_ROOT}", "export OMP_NUM_THREADS=1"],
    )
    function = preemptible(submitit_job.train) if wrap else submitit_job.train
    sub = executor.submit(function, str(run), str(reports), STEPS)
    job = Job(sub.job_id, Path(sub.paths.stdout), reports, Path(sub.paths.submission_file))
    s.jobs.append(job)
    s.runs.append(run)
    preempt(sub, job, run)
    s.wait(lambda: sub.paths.result_pickle.exists(), "the submitit result", timeout=180)
    return {
        "result": sub.result(),
        "fields": s.wait_done(job),
        "events": read_events(run),
        "reports": [job.report(0), job.report(1)],
        "stderr": Path(sub.paths.stderr).read_text(errors="replace"),
    }


def drive_submitit(s: Scenario) -> dict[str, Any]:
    # Submitit runs the function under srun: a plain scancel --signal reaches it.
    return _submitit(s, lambda sub, job, run: _preempt(s, job, run, "USR2", batch=False))


def drive_submitit_unwrapped(s: Scenario) -> dict[str, Any]:
    def usr2(sub: Any, job: Job, run: Path) -> None:
        _preempt(s, job, run, "USR2", batch=False)

    return _submitit(s, usr2, wrap=False)


def drive_submitit_interrupt(s: Scenario) -> dict[str, Any]:
    def interrupt(sub: Any, job: Job, run: Path) -> None:
        s.wait_training(job, 0)
        s.wait(lambda: _heartbeat_step(run, 0) >= 10, "attempt 0 past step 10")
        sub._interrupt()  # submitit's own preemption for tests: SIGTERM, then USR2

    return _submitit(s, interrupt)


def _check_one_preemption(r: dict[str, Any]) -> None:
    events = r["events"]
    assert r["fields"]["JobState"] == "COMPLETED" and r["fields"]["Restarts"] == "1"
    saves = [e for e in events if e.KIND == "checkpoint_saved"]
    assert [e.trigger for e in saves] == ["signal"]
    assert len([e for e in events if e.KIND == "requeue_issued"]) == 1
    ends = {e.attempt: e for e in events if e.KIND in ("run_finished", "run_failed")}
    assert (ends[0].KIND, ends[0].reason) == ("run_finished", "preempted")
    assert (ends[1].KIND, ends[1].reason) == ("run_finished", "completed")
    assert r["reports"][1]["first_step"] == saves[0].step + 1  # nothing redone
    assert r["result"] == {"attempt": 1, "first_step": saves[0].step + 1, "last_step": STEPS - 1}


@scenario(drive_submitit)
def test_submitit_preemption_saves_once_requeues_once_and_returns_the_final_result(
    scenarios: Scenarios,
) -> None:
    """A plain function with ckptdash.Monitor, submitted with submitit's defaults through
    ckptdash.submitit.preemptible and preempted by USR2: one signal save at a step boundary,
    one requeue, the next attempt resumes right after that save, and job.result() returns the
    completed training's value (not the preempted attempt's)."""
    _check_one_preemption(scenarios.result(drive_submitit))


@scenario(drive_submitit_interrupt)
def test_submitits_own_interrupt_sigterm_then_usr2_is_one_save_and_one_requeue(
    scenarios: Scenarios,
) -> None:
    """submitit's job._interrupt() (SIGTERM, then USR2 a moment later, as SLURM preempts a
    job): the two signals add up to one preemption — one signal save, one requeue, the next
    attempt resumes right after the save and job.result() is the completed training's."""
    _check_one_preemption(scenarios.result(drive_submitit_interrupt))


@scenario(drive_submitit_unwrapped)
def test_an_unwrapped_submitit_function_with_a_monitor_block_returns_the_final_result(
    scenarios: Scenarios,
) -> None:
    """The same plain function submitted *without* preemptible(): its ``with Monitor`` block
    ends the preempted attempt without a result, so job.result() is still the completed
    training's value, not the early return of the preempted attempt; no wrap warning."""
    r = scenarios.result(drive_submitit_unwrapped)
    _check_one_preemption(r)
    assert "not wrapped" not in r["stderr"]
