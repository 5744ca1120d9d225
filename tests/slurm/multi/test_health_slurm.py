"""Real multi-node SLURM: a job hung in a collective is found and requeued by `ckptdash watch`,
a crash loop is held as a restart storm, and a node going DOWN is survived (docs/health.md)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ckptdash.events import Event
from tests.slurm.harness import (
    JOBS,
    Job,
    Scenario,
    Scenarios,
    free_port,
    read_events,
)
from tests.slurm.multi.conftest import MEASUREMENTS, multi_scenario

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

PY = shlex.quote(sys.executable)
HUNG_AFTER_S = 8.0


def submit(s: Scenario, body: str, *options: str) -> Job:
    """sbatch a script whose body is ``body`` (this tier's jobs need more than one exec line)."""
    n = len(s.jobs)
    script = s.root / f"job{n}.sh"
    script.write_text(f"#!/bin/bash\n{body}\n")
    output = s.root / f"job{n}-%j.out"
    proc = s.cluster.run(
        "sbatch",
        "--parsable",
        f"--job-name=ckptdash-{s.name}",
        f"--output={output}",
        "--open-mode=append",
        f"--chdir={s.root}",
        *options,
        str(script),
    )
    job_id = proc.stdout.strip().split(";")[0]
    job = Job(job_id, Path(str(output).replace("%j", job_id)), s.root / f"reports{n}", script)
    s.jobs.append(job)
    return job


def job_args(s: Scenario, run: Path, *args: str) -> str:
    """monitor_job.py's arguments: 50 ms steps, 10 of them unless ``args`` say otherwise."""
    n = len(s.jobs)
    job = [str(JOBS / "monitor_job.py"), str(run), str(s.root / f"reports{n}")]
    return shlex.join([*job, "--step-time", "0.05", "--max-steps", "10", *args])


@contextmanager
def watching(s: Scenario, run: Path, *args: str) -> Iterator[Path]:
    """`ckptdash watch RUN --interval 1 --exec 'cat >> alerts.jsonl' ARGS` on the login node
    (this machine) while the block runs; yields the file the --exec hook appends alerts to."""
    alerts = s.root / "alerts.jsonl"
    log = (s.root / "watch.log").open("w")
    argv = [sys.executable, "-m", "ckptdash", "watch", str(run), "--interval", "1"]
    argv += ["--exec", f"cat >> {shlex.quote(str(alerts))}", *args]
    proc = subprocess.Popen(argv, env=s.cluster.env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield alerts
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def alert_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def of(events: list[Event], kind: str, **match: Any) -> list[Any]:
    return [
        e for e in events if kind == e.KIND and all(getattr(e, k) == v for k, v in match.items())
    ]


# --- a rank hangs inside a collective --------------------------------------------------------


def drive_hung_collective(s: Scenario) -> dict[str, Any]:
    run = s.root / "run"
    args = job_args(s, run, "--max-steps", "40", "--save-every", "10", "--hang-at", "25")
    args += f" --hang-rank 1 --hang-attempt 0 --hung-after 6 --port {free_port()}"
    job = submit(
        s,
        f"exec srun --kill-on-bad-exit=0 {PY} {args}",
        "--requeue",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--nodelist=node1,node2",
    )
    s.wait(lambda: job.report(0, 0), "attempt 0 to train", timeout=120)
    with watching(s, run, "--on", "hung=requeue", "--hung-after", str(HUNG_AFTER_S)) as alerts:
        fields = s.wait_done(job, timeout=150)
        s.wait(lambda: len(alert_lines(alerts)) >= 2, "the watch to fire raised and cleared")
    return {
        "job": job.job_id,
        "fields": fields,
        "reports": {(a, k): job.report(a, k) for a in (0, 1) for k in (0, 1)},
        "events": read_events(run),
        "status": s.status(run),
        "alerts": alert_lines(alerts),
    }


@multi_scenario(drive_hung_collective)
def test_hung_collective_is_raised_requeued_and_resumed(multi_scenarios: Scenarios) -> None:
    """A 2-node job (rank 0 on node1, rank 1 on node2): rank 1 stops at step 25 and rank 0
    waits inside the all_reduce for ever. Both keep pulsing, so `ckptdash watch --on
    hung=requeue --hung-after 8` raises hung about 8 s after the last step, runs `scontrol
    requeue`, and the job resumes from its step-20 save and completes; the run's log holds the
    alert, the action and the clear, and the in-job watchdog's own record of the hang."""
    r = multi_scenarios.result(drive_hung_collective)
    events, status, reports = r["events"], r["status"], r["reports"]
    assert r["fields"]["JobState"] == "COMPLETED" and r["fields"]["Restarts"] == "1"
    hosts = {x["rank"]: x["host"] for x in status["ranks"]["0"]}
    assert hosts == {0: "node1", 1: "node2"}

    (raised,) = of(events, "alert_raised", alert="hung", source="watch")
    stopped = max(x["step_since"] for x in status["ranks"]["0"])
    latency = raised.t - stopped
    assert HUNG_AFTER_S <= latency < HUNG_AFTER_S + 10, latency
    (action,) = of(events, "action_taken", alert="hung")
    assert (action.action, action.ok) == ("requeue", True)
    assert action.command == f"scontrol requeue {r['job']}"
    assert of(events, "alert_cleared", alert="hung", source="watch")
    assert [(a["event"], a["alert"]) for a in r["alerts"]][:2] == [
        ("raised", "hung"),
        ("cleared", "hung"),
    ]
    assert of(events, "alert_raised", alert="hung", source="job", attempt=0)

    assert status["attempts"]["1"]["resumed_from"].endswith("step=20.ckpt")
    assert reports[(1, 0)]["first_step"] == 21 and reports[(1, 0)]["finished"]
    assert reports[(1, 1)]["finished"]
    resumed = of(events, "run_started", attempt=1)[0].t
    MEASUREMENTS.append(
        (
            "hung collective (2 nodes)",
            {
                "last step to hung raised, s": latency,
                "hung raised to attempt 1 started, s": resumed - raised.t,
            },
        )
    )


# --- a crash at start-up on every attempt -----------------------------------------------------


def drive_crash_loop(s: Scenario) -> dict[str, Any]:
    run = s.root / "run"
    args = job_args(s, run, "--crash")
    # The wrapper many clusters use: requeue the job whenever training exits with an error.
    job = submit(s, f"{PY} {args} || scontrol requeue $SLURM_JOB_ID", "--requeue", "--nodes=1")
    s.wait(lambda: (run / "events").is_dir(), "the run directory", timeout=60)
    with watching(s, run, "--on", "restart_storm=hold"):
        s.wait(
            lambda: of(read_events(run), "action_taken", alert="restart_storm"),
            "the watch to hold the job",
            timeout=120,
        )
        # Held while its requeue completes, the job shows COMPLETING first, then PENDING.
        held = s.wait(
            lambda: (
                (q := s.cluster.squeue(job.job_id))
                and q[0] == "PENDING"
                and "held" in q[1].lower()
                and q
            ),
            "the job to be held pending in the queue",
            timeout=60,
        )
    events = read_events(run)
    s.cluster.run("scancel", job.job_id)
    return {"job": job.job_id, "held": held, "events": events}


@multi_scenario(drive_crash_loop)
def test_crash_loop_is_a_restart_storm_and_is_held(multi_scenarios: Scenarios) -> None:
    """A job whose training raises at start-up, in a script that requeues on any error: three
    attempts in a row fail without a checkpoint, `ckptdash watch --on restart_storm=hold`
    raises restart_storm and holds the job, and the hold is in the run's log with its result."""
    r = multi_scenarios.result(drive_crash_loop)
    events = r["events"]
    assert r["held"][0] == "PENDING" and "held" in r["held"][1].lower()
    failed = {e.attempt for e in of(events, "run_failed")}
    assert len(failed) >= 3
    (raised,) = of(events, "alert_raised", alert="restart_storm", source="watch")
    assert "no valid checkpoint" in raised.detail
    (action,) = of(events, "action_taken", alert="restart_storm")
    assert action.ok and action.action == "hold", action.result
    MEASUREMENTS.append(("crash loop", {"attempts before the hold": float(len(failed))}))


# --- a node goes DOWN mid-run ----------------------------------------------------------------


def drive_node_down(s: Scenario) -> dict[str, Any]:
    run = s.root / "run"
    args = job_args(s, run, "--max-steps", "300", "--port", str(free_port()))
    job = submit(
        s,
        f"exec srun --kill-on-bad-exit=0 {PY} {args}",
        "--requeue",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--nodelist=node1,node3",
    )
    s.wait(lambda: job.report(0, 0) and job.report(0, 1), "attempt 0 to train", timeout=120)
    s.wait(
        lambda: any(e.KIND == "pulse" and (e.step or 0) >= 5 for e in read_events(run)),
        "step 5 of attempt 0",
    )
    s.cluster.run("scontrol", "update", "NodeName=node3", "State=DOWN", "Reason=ckptdash-test")
    try:
        s.wait(lambda: of(read_events(run), "run_finished", attempt=0), "attempt 0 to end")
    finally:
        s.cluster.run("scontrol", "update", "NodeName=node3", "State=RESUME", check=False)
    fields = s.wait_done(job, timeout=150)
    return {
        "job": job.job_id,
        "fields": fields,
        "events": read_events(run),
        "status": s.status(run),
        "reports": {(a, k): job.report(a, k) for a in (0, 1) for k in (0, 1)},
    }


@multi_scenario(drive_node_down)
def test_node_down_mid_run_is_recorded_and_resumed(multi_scenarios: Scenarios) -> None:
    """A 2-node job (node1, node3); node3 is set DOWN mid-run: SLURM sends SIGTERM, the ranks
    save at one step and record the attempt's end, SLURM requeues the job by itself, and once
    node3 is back the next attempt of the same job resumes from that save and completes."""
    r = multi_scenarios.result(drive_node_down)
    events, status = r["events"], r["status"]
    assert r["fields"]["JobState"] == "COMPLETED" and int(r["fields"]["Restarts"]) >= 1
    a0, a1 = status["attempts"]["0"], status["attempts"]["1"]
    assert a0["outcome"] == "stopped" and a0["end_reason"] == "terminated"
    assert of(events, "signal_received", attempt=0, signal="SIGTERM")
    (saved,) = of(events, "checkpoint_saved", attempt=0, trigger="signal")
    assert a1["job_id"] == a0["job_id"] == r["job"]
    assert a1["resumed_from"].endswith(Path(saved.path).name)
    assert r["reports"][(1, 0)]["first_step"] == saved.step + 1
    assert r["reports"][(1, 0)]["finished"]
    assert {x["host"] for x in status["ranks"]["0"]} == {"node1", "node3"}
