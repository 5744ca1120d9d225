"""Real SLURM: a signal after ``run_finished`` does not change how the job ended (issue 32,
point 8). SLURM's ``--signal=B:USR2@120`` can land in the last seconds, while Lightning tears
down after the run finished; USR2's default action would then end the completed process by
signal and SLURM would record FAILED."""

from __future__ import annotations

from typing import Any

import pytest

from tests.slurm.harness import Scenario, Scenarios, first, read_events, scenario

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]


def drive_late_signal(s: Scenario) -> dict[str, Any]:
    run = s.root / "run"
    # Unpaused steps: it finishes at once, then waits (up to 120 s) for the test's signal.
    job = s.lightning(run, "--requeue", max_steps=20, step_time=0, linger_for_signal=120)
    s.wait(lambda: (r := job.report(0)) and r.get("lingering"), "fit() to return")
    finished = first(read_events(run), "run_finished", 0)
    s.cluster.run("scancel", "--batch", "--signal=USR2", job.job_id)
    r: dict[str, Any] = {"finished": finished, "end": s.wait_done(job)}
    r["report"] = job.report(0)
    r["status"] = s.status(run)
    r["context"] = s.context() if r["end"].get("JobState") != "COMPLETED" else ""
    return r


@scenario(drive_late_signal)
def test_a_signal_after_run_finished_leaves_the_job_completed(scenarios: Scenarios) -> None:
    """A USR2 after ``run_finished`` (fit() returned, the process still up) is recorded and
    ignored: the process exits 0 and SLURM says COMPLETED, exit 0:0, not FAILED by signal 12;
    the run's attempt stays finished and nothing requeues it."""
    r = scenarios.result(drive_late_signal)
    assert r["finished"].reason == "completed"
    assert r["end"]["JobState"] == "COMPLETED", r["context"]
    assert r["end"]["ExitCode"] == "0:0", r["context"]
    assert r["end"]["Restarts"] == "0"
    assert r["report"]["late_signals"] == ["SIGUSR2"]
    attempt = r["status"]["attempts"]["0"]
    assert attempt["outcome"] == "finished"
    assert r["status"]["requeues"] == []
