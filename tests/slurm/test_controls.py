"""Real SLURM: the controls — suspend/resume requeue, pin, and cancelling a requeue that
already happened (hold, release, cancel the pending job) — with the scheduler's view."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.slurm.harness import (
    POLL_S,
    Scenario,
    Scenarios,
    first,
    read_events,
    scenario,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

LONG = 4000  # x 30 ms: two minutes, far longer than the scenario: a control ends it
FAST_STEPS = 1000  # 30 s paused in the signalled attempt, seconds unpaused after the requeue
HOLD_AT = 100  # the step a signalled attempt waits in until the test's signal is in


def _events(run: Path, kind: str, attempt: int | None = None) -> list[Any]:
    return [
        e for e in read_events(run) if kind == e.KIND and (attempt is None or e.attempt == attempt)
    ]


# --- 4. suspend and resume from the control channel -----------------------------------------


def drive_suspend(s: Scenario) -> dict[str, Any]:
    run = s.root / "run"
    job = s.lightning(run, "--requeue", max_steps=LONG)
    s.wait_training(job, 0)
    r: dict[str, Any] = {"job": job.job_id}
    r["suspend_out"] = s.cluster.ckptdash("requeue", str(run), "--suspend").stdout
    r["suspended"] = s.cluster.job(job.job_id)
    refused = s.cluster.run("scontrol", "requeue", job.job_id, check=False)
    r["external_requeue"] = (refused.returncode, refused.stdout + refused.stderr)
    r["status_text"] = s.cluster.ckptdash("status", str(run)).stdout
    s.cluster.run("scancel", "--batch", "--signal=USR2", job.job_id)
    r["end"] = s.wait_done(job)
    r["squeue"] = s.cluster.squeue(job.job_id)
    r["status"] = s.status(run)
    r["reports"] = [job.report(0), job.report(1)]
    r["events"] = read_events(run)
    return r


@scenario(drive_suspend)
def test_suspend_from_control_channel_saves_and_ends_without_requeue(
    scenarios: Scenarios,
) -> None:
    """`ckptdash requeue RUN --suspend` while the job runs: the next USR2 saves, records
    requeue_skipped (suspended) and ends the job; SLURM shows it COMPLETED, never pending again.
    The suspension is mirrored onto SLURM (Requeue=0), so a requeue from outside — what a
    preemption does — is refused too."""
    r = scenarios.result(drive_suspend)
    job = r["job"]
    assert f"slurm job {job}: Requeue=0" in r["suspend_out"]
    assert r["suspended"]["Requeue"] == "0"
    rc, out = r["external_requeue"]
    assert rc != 0
    assert "Requested operation is presently disabled" in out
    assert "requeue off (Requeue=0)" in r["status_text"]

    assert r["end"]["JobState"] == "COMPLETED"
    assert r["end"]["Restarts"] == "0"
    assert r["squeue"] is None or r["squeue"][0] == "COMPLETED"
    assert r["reports"][1] is None  # no second attempt
    events = r["events"]
    saved = first(events, "checkpoint_saved", 0)
    assert saved.trigger == "signal"
    skipped = first(events, "requeue_skipped", 0)
    assert "suspended" in skipped.reason
    assert not [e for e in events if e.KIND == "requeue_issued"]
    status = r["status"]
    assert (status["attempts"]["0"]["outcome"], status["attempts"]["0"]["end_reason"]) == (
        "stopped",
        "preempted",
    )
    assert status["scheduler"]["state"] == "COMPLETED"
    assert status["scheduler"]["requeue"] is False


def drive_suspend_then_resume(s: Scenario) -> dict[str, Any]:
    run = s.root / "run"
    # Attempt 0 stops in step HOLD_AT until the signal is in, so it cannot reach max_steps
    # first however slow the CLI calls are; the attempt after the requeue runs unpaused.
    job = s.lightning(
        run, "--requeue", max_steps=FAST_STEPS, fast_from_attempt=1, hold_at_step=HOLD_AT
    )
    s.wait_training(job, 0)
    r: dict[str, Any] = {"job": job.job_id}
    s.cluster.ckptdash("requeue", str(run), "--suspend")
    r["suspended"] = s.cluster.job(job.job_id)
    r["resume_out"] = s.cluster.ckptdash("requeue", str(run), "--resume").stdout
    r["resumed"] = s.cluster.job(job.job_id)
    s.cluster.run("scancel", "--batch", "--signal=USR2", job.job_id)
    r["end"] = s.wait_done(job)
    r["reports"] = [job.report(0), job.report(1)]
    r["status"] = s.status(run)
    r["context"] = s.context() if r["end"].get("JobState") != "COMPLETED" else ""
    return r


@scenario(drive_suspend_then_resume)
def test_resume_after_suspend_restores_requeue_for_the_next_signal(scenarios: Scenarios) -> None:
    """Suspend then `ckptdash requeue RUN --resume` on a running job: SLURM's Requeue flag goes
    0 then back to 1, and the next USR2 saves, requeues, and the job resumes and completes."""
    r = scenarios.result(drive_suspend_then_resume)
    job = r["job"]
    assert r["suspended"]["Requeue"] == "0"
    assert f"slurm job {job}: Requeue=1" in r["resume_out"]
    assert r["resumed"]["Requeue"] == "1"
    assert r["end"]["JobState"] == "COMPLETED", r["context"]
    assert r["end"]["Restarts"] == "1"
    status = r["status"]
    assert [(q["attempt"], q["issued"]) for q in status["requeues"]] == [(0, True)]
    assert r["status"]["attempts"]["0"]["step"] <= HOLD_AT + 1
    assert r["reports"][1]["final_step"] == FAST_STEPS


# --- 5. pin ------------------------------------------------------------------------------------


def drive_pin(s: Scenario) -> dict[str, Any]:
    run = s.root / "run"
    job = s.lightning(
        run, "--requeue", max_steps=FAST_STEPS, periodic_every=20, fast_from_attempt=1
    )
    s.wait_training(job, 0)
    periodic = s.wait(
        lambda: (
            (found := [e for e in _events(run, "checkpoint_saved", 0) if e.trigger == "periodic"])
            and len(found) >= 3
            and found
        ),
        "three periodic checkpoints",
    )
    pinned = min(periodic, key=lambda e: e.step)  # an older one, not the newest
    pin_out = s.cluster.ckptdash("resume", str(run), "--pin", pinned.path).stdout
    s.cluster.run("scancel", "--batch", "--signal=USR2", job.job_id)
    end = s.wait_done(job)
    return {
        "pinned": pinned,
        "pin_out": pin_out,
        "end": end,
        "events": read_events(run),
        "reports": [job.report(0), job.report(1)],
    }


@scenario(drive_pin)
def test_pin_from_control_channel_makes_next_attempt_resume_from_exactly_it(
    scenarios: Scenarios,
) -> None:
    """`ckptdash resume RUN --pin PATH` of an older periodic checkpoint while the job runs: after
    the preemption the next attempt resumes from exactly that file (not the newer signal save)
    and trains on from its step to the end; that attempt consumed the pin."""
    r = scenarios.result(drive_pin)
    pinned, events = r["pinned"], r["events"]
    assert "pinned in the run settings" in r["pin_out"]
    assert r["end"]["JobState"] == "COMPLETED"
    signal_save = next(e for e in events if e.KIND == "checkpoint_saved" and e.trigger == "signal")
    assert signal_save.step > pinned.step  # the rule alone would have picked the signal save
    resumed = first(events, "run_resumed", 1)
    assert resumed.path == pinned.path
    assert resumed.reason.startswith("pinned in the run settings; pin consumed")
    assert r["reports"][1]["first_step"] == pinned.step
    assert r["reports"][1]["final_step"] == FAST_STEPS


# --- 9. cancel a requeue that already happened ----------------------------------------------

HOLD_OBSERVE_S = 15.0  # longer than the 6-8 s a requeued job waits before it restarts here


def drive_cancel_requeue(s: Scenario) -> dict[str, Any]:
    run = s.root / "run"
    job = s.lightning(run, "--requeue", max_steps=LONG)
    r: dict[str, Any] = {"job": job.job_id}
    s.wait_training(job, 0)
    # While it runs there is nothing pending to hold or cancel: one clear line, exit 2.
    r["hold_running"] = s.cluster.ckptdash("requeue", str(run), "--hold", check=False)
    r["cancel_running"] = s.cluster.ckptdash(
        "requeue", str(run), "--cancel-pending", "--yes", check=False
    )

    # Preempted and requeued: hold it while it waits in the queue. The run's requeue_issued
    # event comes first; SLURM shows the job pending once the batch step has ended (under load,
    # seconds later): hold it then, as a user would see it. This cluster lets a requeued job
    # start again after 5 s (a real one after 120 s, CRED_EXPIRE in start.sh): a machine busy
    # enough to miss that window preempts the restarted attempt and tries again.
    extra = 0
    while True:
        s.cluster.run("scancel", "--batch", "--signal=USR2", job.job_id)
        s.wait_requeued(run, 1 + extra)
        until = time.monotonic() + 60
        while (s.cluster.squeue(job.job_id) or ("",))[0] != "PENDING":
            assert time.monotonic() < until, "the requeued job never showed PENDING"
            time.sleep(POLL_S)
        hold = s.cluster.ckptdash("requeue", str(run), "--hold", check=False)
        if hold.returncode == 0 or extra == 2 or "is RUNNING" not in hold.stderr:
            break
        extra += 1  # it started again before the hold: the next attempt is preempted too
        s.wait_training(job, extra)
    assert hold.returncode == 0, hold.stderr
    r["extra"] = extra
    r["hold_out"] = hold.stdout
    r["held_squeue"] = s.cluster.squeue(job.job_id)
    r["held_status_text"] = s.cluster.ckptdash("status", str(run)).stdout
    r["held_status"] = s.status(run)
    seen = set()
    until = time.monotonic() + HOLD_OBSERVE_S
    while time.monotonic() < until:  # an observation window, not a synchronisation
        seen.add(s.cluster.squeue(job.job_id))
        time.sleep(POLL_S * 5)
    r["held_states_seen"] = seen
    r["release_out"] = s.cluster.ckptdash("requeue", str(run), "--release").stdout
    r["attempt1"] = s.wait_training(job, 1 + extra)

    # Preempted again: this time cancel the pending job.
    s.cluster.run("scancel", "--batch", "--signal=USR2", job.job_id)
    s.wait_requeued(run, 2 + extra)
    r["cancel_out"] = s.cluster.ckptdash("requeue", str(run), "--cancel-pending", "--yes").stdout
    r["end"] = s.wait_done(job)
    r["end_status"] = s.status(run)
    r["attempt2"] = job.report(2 + extra)
    return r


@scenario(drive_cancel_requeue)
def test_hold_release_and_cancel_a_pending_requeued_job_from_the_cli(
    scenarios: Scenarios,
) -> None:
    """After ckptdash requeued the job and no training process exists, `ckptdash requeue RUN
    --hold` keeps the pending job from restarting (PENDING/JobHeldAdmin, shown by `ckptdash
    status` next to the run's events), `--release` lets it restart and resume, and
    `--cancel-pending --yes` after the next requeue cancels it: no further attempt."""
    r = scenarios.result(drive_cancel_requeue)
    job, extra = r["job"], r["extra"]  # extra: attempts restarted before a hold could land
    for proc in (r["hold_running"], r["cancel_running"]):
        assert proc.returncode == 2
        assert proc.stderr.count("\n") == 1
        assert f"slurm job {job} is RUNNING" in proc.stderr
        assert "Traceback" not in proc.stderr

    assert f"slurm job {job}: held" in r["hold_out"]
    assert r["held_squeue"] == ("PENDING", "JobHeldAdmin")
    assert r["held_states_seen"] == {("PENDING", "JobHeldAdmin")}
    text = r["held_status_text"]
    assert f"scheduler: slurm job {job}: PENDING (JobHeldAdmin), held" in text
    assert f"requeue attempt {extra} issued: scontrol requeue {job}" in text
    view = r["held_status"]["scheduler"]
    assert (view["state"], view["reason"], view["held"]) == ("PENDING", "JobHeldAdmin", True)
    assert r["held_status"]["attempts"][str(extra)]["outcome"] == "stopped"

    assert f"slurm job {job}: released" in r["release_out"]
    assert r["attempt1"]["restart_count"] == str(1 + extra)

    assert f"slurm job {job}: cancelled while pending" in r["cancel_out"]
    assert r["end"]["JobState"] == "CANCELLED"
    assert r["attempt2"] is None
    end = r["end_status"]
    assert sorted(end["attempts"], key=int) == [str(n) for n in range(2 + extra)]
    assert end["scheduler"]["state"] == "CANCELLED"
    assert [q["issued"] for q in end["requeues"]] == [True] * (2 + extra)
