"""Real SLURM: preemption signal, time limit, external requeue and the requeue budget.

Each test names a scenario driver that submits real jobs with sbatch to the tier's
single-node cluster, acts on them (scancel, scontrol) and returns what it observed; all
drivers run at the same time (see conftest.py), the test asserts.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.slurm.harness import (
    MEASUREMENTS,
    Scenario,
    Scenarios,
    first,
    read_events,
    requeue_timings,
    restart_timings,
    scenario,
    starts_first,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

STEPS = 400  # x 30 ms: about 12 s of training, long enough to be signalled mid-run


def _heartbeat_step(run: Path, attempt: int) -> int:
    """The latest step rank 0 of ``attempt`` reported (-1 before any heartbeat)."""
    steps = [e.step for e in read_events(run) if e.attempt == attempt and e.KIND == "heartbeat"]
    return max((s for s in steps if s is not None), default=-1)


# --- 1. preemption signal --------------------------------------------------------------------


def drive_preempt_signal(s: Scenario) -> dict[str, Any]:
    run = s.root / "run"
    job = s.lightning(run, "--requeue", "--signal=B:USR2@5", max_steps=STEPS)
    s.wait_training(job, 0)
    s.wait(lambda: _heartbeat_step(run, 0) >= 10, "attempt 0 past step 10")
    sent = time.time()
    s.cluster.run("scancel", "--batch", "--signal=USR2", job.job_id)
    fields = s.wait_done(job)
    return {
        "sent": sent,
        "job": job.job_id,
        "fields": fields,
        "reports": [job.report(0), job.report(1)],
        "events": read_events(run),
        "status": s.status(run),
        "run": run,
    }


@scenario(drive_preempt_signal)
def test_preempted_lightning_job_saves_requeues_and_resumes_at_the_next_step(
    scenarios: Scenarios,
) -> None:
    """A Lightning job (CkptDashCallback, --requeue --signal=B:USR2) preempted with
    `scancel --batch --signal=USR2` saves a signal checkpoint, ckptdash runs `scontrol requeue`,
    SLURM restarts it with SLURM_RESTART_COUNT=1, it resumes from that checkpoint at the next
    step and completes at exactly max_steps; `ckptdash status --json` shows both attempts of
    the one job on one timeline."""
    r = scenarios.result(drive_preempt_signal)
    job, events = r["job"], r["events"]
    assert r["fields"]["JobState"] == "COMPLETED"
    assert r["fields"]["Restarts"] == "1"

    a0, a1 = r["reports"]
    assert a0["restart_count"] in (None, "0")
    assert a1["restart_count"] == "1"
    signal = first(events, "signal_received", 0)
    assert (signal.signal, signal.action) == ("SIGUSR2", "requeue")
    saved = first(events, "checkpoint_saved", 0)
    assert saved.trigger == "signal"
    # (a0's own final_step may be missing: after the requeue SLURM's SIGTERM may end the process
    # inside Lightning's teardown, after ckptdash recorded the end.)
    assert saved.step == signal.step == first(events, "run_finished", 0).step
    requeued = first(events, "requeue_issued", 0)
    assert requeued.job_id == job
    assert requeued.command == f"scontrol requeue {job}"
    assert first(events, "run_resumed", 1).path == saved.path
    assert a1["first_step"] == saved.step  # the next step after the saved one, nothing redone
    assert a1["final_step"] == STEPS

    status = r["status"]
    attempts = status["attempts"]
    assert sorted(attempts) == ["0", "1"]
    assert {a["job_id"] for a in attempts.values()} == {job}
    assert (attempts["0"]["outcome"], attempts["0"]["end_reason"]) == ("stopped", "preempted")
    assert attempts["1"]["outcome"] == "finished"
    assert attempts["1"]["resumed_from"] == saved.path
    assert attempts["0"]["ended_at"] <= attempts["1"]["started_at"]
    assert [q["issued"] for q in status["requeues"]] == [True]
    assert status["scheduler"]["state"] == "COMPLETED"

    timings = {"scancel_to_handler": signal.t - r["sent"], **requeue_timings(events, 0)}
    restart = restart_timings(events, 1, a1["t_process_start"])
    MEASUREMENTS.append(("signal -> requeue (preempt)", timings))
    MEASUREMENTS.append(("restart -> resumed (preempt)", restart))
    print(f"signal to requeue: {timings}\nrestart to resumed: {restart}")


# --- 2. time limit ---------------------------------------------------------------------------

TL_STEPS = 8000  # at 20 ms a step the first two attempts cannot finish before their signal


@starts_first
def drive_time_limit(s: Scenario) -> dict[str, Any]:
    run = s.root / "run"
    # -t 2 --signal=B:USR2@50: slurmctld checks limits every 30 s and sends the warning at
    # the first check with less than 50 + 30 s left, so the signal comes 40-70 s into each
    # attempt and the kill 120-150 s in. The 40 s are for the job's start: every scenario
    # starts at once, and a USR2 before ckptdash handles it would kill the job (a 1-minute
    # limit with @20, 10-40 s, once lost that race under load). Attempts from 2 on train
    # unpaused, and once the second requeue is issued the job's limit is raised to 30 minutes:
    # a third attempt slowed past its own warning (a loaded machine did that: it saved and
    # requeued a third time) would make the scenario's end depend on the machine's speed.
    job = s.monitor(
        run,
        "--requeue",
        "--time=2",
        "--signal=B:USR2@50",
        max_steps=TL_STEPS,
        step_time=0.02,
        fast_from_attempt=2,
    )
    s.wait_training(job, 0, 0)  # the other scenarios' jobs start from here on
    s.wait_requeued(run, 2, timeout=420)
    s.cluster.run("scontrol", "update", f"JobId={job.job_id}", "TimeLimit=30")
    fields = s.wait_done(job, timeout=420)
    return {
        "job": job.job_id,
        "fields": fields,
        "reports": [job.report(a, 0) for a in range(3)],
        "events": read_events(run),
        "status": s.status(run),
        "log": job.log_tail(80),
    }


@scenario(drive_time_limit)
def test_time_limit_signal_saves_and_requeues_before_the_kill_twice_then_completes(
    scenarios: Scenarios,
) -> None:
    """With a 2-minute limit and --signal=B:USR2@50, SLURM's own warning signal makes the job
    save and requeue itself before the time-limit kill, in two attempts in a row (no SIGTERM,
    no TIMEOUT); the third attempt (its limit raised once the second requeue is issued) resumes
    from the second's signal checkpoint and completes."""
    r = scenarios.result(drive_time_limit, timeout=500)
    events, status = r["events"], r["status"]
    why = (
        f"scontrol: {r['fields']}\noutcomes: "
        f"{[(n, a['outcome'], a['end_reason']) for n, a in status['attempts'].items()]}"
        f"\njob output:\n{r['log']}"
    )
    assert r["fields"]["JobState"] == "COMPLETED", why
    assert r["fields"]["Restarts"] == "2", why
    for attempt in (0, 1):
        sig = first(events, "signal_received", attempt)
        assert sig.signal == "SIGUSR2"  # the attempt's first signal: no time-limit SIGTERM yet
        saved = first(events, "checkpoint_saved", attempt)
        assert (saved.trigger, saved.step) == ("signal", sig.step)
        assert first(events, "requeue_issued", attempt).job_id == r["job"]
        info = status["attempts"][str(attempt)]
        assert (info["outcome"], info["end_reason"]) == ("stopped", "preempted")
        assert info["ended_at"] - info["started_at"] < 120  # saved before the 2-minute limit
    second_save = first(events, "checkpoint_saved", 1)
    assert first(events, "run_resumed", 2).path == second_save.path
    last = r["reports"][2]
    assert last["first_step"] == second_save.step + 1
    assert last["finished"]
    assert status["attempts"]["2"]["outcome"] == "finished"
    MEASUREMENTS.append(
        (
            "time limit 120 s, --signal=B:USR2@50: signal after the attempt started",
            {
                f"attempt {a}": first(events, "signal_received", a).t
                - first(events, "run_started", a).t
                for a in (0, 1)
            },
        )
    )
    for attempt in (0, 1):
        MEASUREMENTS.append(
            (f"signal -> requeue (time limit, attempt {attempt})", requeue_timings(events, attempt))
        )


# --- 3. external requeue (what a preemption by a higher-priority job looks like) -------------


def drive_external_requeue(s: Scenario) -> dict[str, Any]:
    run = s.root / "run"
    job = s.lightning(run, "--requeue", max_steps=STEPS, periodic_every=25)
    s.wait_training(job, 0)
    s.wait(
        lambda: (
            sum(
                1
                for e in read_events(run)
                if e.KIND == "checkpoint_saved" and e.trigger == "periodic"
            )
            >= 2
        ),
        "two periodic checkpoints",
    )
    s.cluster.run("scontrol", "requeue", job.job_id)
    fields = s.wait_done(job)
    return {
        "job": job.job_id,
        "fields": fields,
        "reports": [job.report(0), job.report(1)],
        "events": read_events(run),
    }


@scenario(drive_external_requeue)
def test_external_requeue_sigterm_saves_and_next_attempt_resumes_from_newest_valid(
    scenarios: Scenarios,
) -> None:
    """`scontrol requeue JOB` from outside (as a preemption does) sends SIGTERM: ckptdash saves
    (there is time: KillWait), does not requeue itself, and SLURM's restart resumes from the
    newest valid checkpoint — that signal save, newer than the periodic ones — and completes."""
    r = scenarios.result(drive_external_requeue)
    events = r["events"]
    assert r["fields"]["JobState"] == "COMPLETED"
    assert r["fields"]["Restarts"] == "1"
    sig = first(events, "signal_received", 0)
    assert (sig.signal, sig.action) == ("SIGTERM", "terminate")
    saves = [e for e in events if e.KIND == "checkpoint_saved" and e.attempt == 0]
    (signal_save,) = [e for e in saves if e.trigger == "signal"]
    assert signal_save.step == sig.step
    assert any(e.trigger == "periodic" and e.step < signal_save.step for e in saves)
    # The resume rule: newest valid by step, then time (a periodic save may share the step).
    newest = max(saves, key=lambda e: (e.step, e.t))
    assert newest.step == signal_save.step
    assert not [e for e in events if e.KIND in ("requeue_issued", "requeue_skipped")]
    assert first(events, "run_finished", 0).reason == "terminated"
    assert first(events, "run_resumed", 1).path == newest.path
    a1 = r["reports"][1]
    assert a1["first_step"] == newest.step
    assert a1["final_step"] == STEPS


# --- 8. requeue budget -----------------------------------------------------------------------

BUDGET_STEPS = 2000  # never reached: the budget ends the job first


def drive_requeue_budget(s: Scenario) -> dict[str, Any]:
    run = s.root / "run"
    job = s.lightning(run, "--requeue", max_steps=BUDGET_STEPS, max_attempts=2)
    for attempt in (0, 1):
        s.wait_training(job, attempt)
        s.wait(lambda a=attempt: _heartbeat_step(run, a) >= 0, f"attempt {attempt} heartbeat")
        s.cluster.run("scancel", "--batch", "--signal=USR2", job.job_id)
        if attempt == 0:
            s.wait_requeued(run)
    fields = s.wait_done(job)
    queue = s.cluster.squeue(job.job_id)
    return {
        "fields": fields,
        "squeue": queue,
        "reports": [job.report(0), job.report(1), job.report(2)],
        "events": read_events(run),
        "status": s.status(run),
    }


@scenario(drive_requeue_budget)
def test_requeue_budget_ends_the_job_with_a_clear_event_instead_of_looping(
    scenarios: Scenarios,
) -> None:
    """With max_attempts=2 the first preemption requeues, the second saves and ends the job
    with a requeue_skipped event naming the budget; SLURM shows it finished, not pending."""
    r = scenarios.result(drive_requeue_budget)
    assert r["fields"]["JobState"] == "COMPLETED"
    assert r["fields"]["Restarts"] == "1"
    assert r["squeue"] is None or r["squeue"][0] not in ("PENDING", "RUNNING")
    assert r["reports"][2] is None  # no third attempt
    requeues = r["status"]["requeues"]
    assert [(q["attempt"], q["issued"]) for q in requeues] == [(0, True), (1, False)]
    assert "requeue budget reached: attempt 2 of 2" in requeues[1]["reason"]
    last = r["status"]["attempts"]["1"]
    assert (last["outcome"], last["end_reason"]) == ("stopped", "preempted")
    assert r["reports"][1]["final_step"] < BUDGET_STEPS
    saved = [e for e in r["events"] if e.KIND == "checkpoint_saved" and e.attempt == 1]
    assert [e.trigger for e in saved] == ["signal"]
