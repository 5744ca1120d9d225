"""Real SLURM: a 2-task job under srun (gloo) and a job array."""

from __future__ import annotations

from typing import Any

import pytest

from tests.slurm.harness import (
    MEASUREMENTS,
    Scenario,
    Scenarios,
    first,
    free_port,
    read_events,
    requeue_timings,
    scenario,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

STEPS = 240


# --- 6. two tasks under srun --------------------------------------------------------------


def drive_two_tasks(s: Scenario) -> dict[str, Any]:
    run = s.root / "run"
    job = s.monitor(run, "--requeue", "--ntasks=2", max_steps=STEPS, srun=True, port=free_port())
    for rank in (0, 1):
        s.wait_training(job, 0, rank)
    # Without --batch: the signal goes to the job's steps, i.e. to both tasks under srun.
    s.cluster.run("scancel", "--signal=USR2", job.job_id)
    fields = s.wait_done(job)
    return {
        "job": job.job_id,
        "fields": fields,
        "reports": {(a, k): job.report(a, k) for a in (0, 1, 2) for k in (0, 1)},
        "events": read_events(run),
        "status": s.status(run),
    }


@scenario(drive_two_tasks)
def test_two_task_srun_job_both_ranks_save_same_step_one_requeue_both_resume(
    scenarios: Scenarios,
) -> None:
    """A --ntasks=2 job (srun, gloo, Monitor): `scancel --signal=USR2` reaches both tasks, both
    ranks decide the save at the same step, rank 0 alone requeues once, and after the restart
    both ranks resume from that checkpoint at the next step and finish."""
    r = scenarios.result(drive_two_tasks)
    reports, events = r["reports"], r["events"]
    assert r["fields"]["JobState"] == "COMPLETED"
    assert r["fields"]["Restarts"] == "1"
    assert reports[(0, 0)]["ntasks"] == reports[(0, 1)]["ntasks"] == "2"
    got = {e.rank for e in events if e.KIND == "signal_received" and e.attempt == 0}
    assert got == {0, 1}
    saved = [reports[(0, k)]["saved_at"] for k in (0, 1)]
    assert saved[0] == saved[1]
    assert len(saved[0]) == 1
    assert reports[(0, 0)]["stopped"] and reports[(0, 1)]["stopped"]
    (requeue,) = [e for e in events if e.KIND == "requeue_issued"]
    assert (requeue.attempt, requeue.rank) == (0, 0)
    ckpt = first(events, "checkpoint_saved", 0)
    assert ckpt.step == saved[0][0]
    for k in (0, 1):
        a1 = reports[(1, k)]
        assert a1["restart_count"] == "1"
        assert a1["loaded"] == ckpt.path
        assert a1["first_step"] == ckpt.step + 1
        assert a1["finished"]
    assert reports[(2, 0)] is None
    assert r["status"]["attempts"]["1"]["world_size"] == 2
    MEASUREMENTS.append(("signal -> requeue (2 tasks)", requeue_timings(events, 0)))


# --- 7. job array ------------------------------------------------------------------------------


def drive_array(s: Scenario) -> dict[str, Any]:
    array = s.lightning(
        s.root / "run-{array_task}", "--requeue", "--array=0-1", max_steps=STEPS, array=True
    )
    tasks = [array.task(0), array.task(1)]
    for task in tasks:
        s.wait_training(task, 0)
    s.cluster.run("scancel", "--batch", "--signal=USR2", tasks[1].job_id)
    ends = [s.wait_done(task) for task in tasks]
    return {
        "array": array.job_id,
        "ends": ends,
        "reports": [[task.report(a) for a in (0, 1)] for task in tasks],
        "events": [read_events(s.root / f"run-{t}") for t in (0, 1)],
    }


@scenario(drive_array)
def test_array_task_requeues_itself_not_the_whole_array(scenarios: Scenarios) -> None:
    """Preempting task 1 of a 2-task job array: ckptdash requeues `ARRAY_1` only; task 1
    restarts and resumes, task 0 runs once, untouched, and both complete."""
    r = scenarios.result(drive_array)
    array = r["array"]
    end0, end1 = r["ends"]
    assert (end0["JobState"], end0["Restarts"]) == ("COMPLETED", "0")
    assert (end1["JobState"], end1["Restarts"]) == ("COMPLETED", "1")
    ev0, ev1 = r["events"]
    requeue = first(ev1, "requeue_issued", 0)
    assert requeue.job_id == f"{array}_1"
    assert requeue.command == f"scontrol requeue {array}_1"
    assert first(ev1, "run_started", 1).job_id == f"{array}_1"
    assert not [e for e in ev0 if e.KIND in ("signal_received", "requeue_issued")]
    assert {e.attempt for e in ev0} == {0}
    (t0_a0, t0_a1), (t1_a0, t1_a1) = r["reports"]
    assert t0_a1 is None
    assert t0_a0["final_step"] == STEPS
    assert t1_a0["first_step"] == 0
    assert t1_a1["first_step"] == first(ev1, "run_finished", 0).step
    assert t1_a1["final_step"] == STEPS
