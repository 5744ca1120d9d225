"""Real SLURM: goodput of a Lightning job preempted twice, as `ckptdash goodput --json`
reports it, checked against the run's own events (docs/goodput.md's definitions).

The scenario runs concurrently with the tier's others (see conftest.py).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from tests.slurm.harness import MEASUREMENTS, Scenario, Scenarios, first, read_events, scenario

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

STEPS = 300  # x 30 ms a step in attempts 0 and 1; attempt 2 trains without the pause


def _step(run: Path, attempt: int) -> int:
    steps = [e.step for e in read_events(run) if e.attempt == attempt and e.KIND == "heartbeat"]
    return max((s for s in steps if s is not None), default=-1)


def drive_preempted_twice(s: Scenario) -> dict[str, Any]:
    run = s.root / "run"
    job = s.lightning(run, "--requeue", max_steps=STEPS, periodic_every=40, fast_from_attempt=2)
    for attempt in (0, 1):
        s.wait_training(job, attempt)
        s.wait(lambda a=attempt: _step(run, a) >= 60 * (a + 1), f"attempt {attempt} training")
        s.cluster.run("scancel", "--batch", "--signal=USR2", job.job_id)
        s.wait_requeued(run, attempt + 1)
    fields = s.wait_done(job)
    out = s.cluster.ckptdash("goodput", str(run), "--json").stdout
    return {
        "fields": fields,
        "goodput": json.loads(out),
        "events": read_events(run),
        "at": time.time(),
    }


@scenario(drive_preempted_twice)
def test_goodput_of_a_lightning_job_preempted_twice(scenarios: Scenarios) -> None:
    """Three attempts: the two preempted ones lose only signal save → end and wait in the
    queue from their end to the next run_started; each attempt's startup is run_started to
    its first heartbeat; saving is every save's duration; the rows add up to the run."""
    r = scenarios.result(drive_preempted_twice)
    assert r["fields"]["JobState"] == "COMPLETED"
    g, events = r["goodput"], r["events"]
    rows = g["attempts"]
    assert [(a["attempt"], a["outcome"]) for a in rows] == [
        (0, "stopped"),
        (1, "stopped"),
        (2, "finished"),
    ]

    def of(kind: str, attempt: int) -> list[Any]:
        return [e for e in events if kind == e.KIND and e.attempt == attempt and e.rank == 0]

    for a in (0, 1, 2):
        row = rows[a]["badput_s"]
        started = first(events, "run_started", a).t
        assert row["startup"] == pytest.approx(first(events, "heartbeat", a).t - started, abs=1e-5)
        saves = of("checkpoint_saved", a)
        assert row["saving"] == pytest.approx(math.fsum(e.duration_s for e in saves), abs=1e-5)
        end = first(events, "run_finished", a).t
        if a < 2:
            # The signal save, and a periodic one after it when the signal landed on a
            # periodic step (every 40): lost work runs from the last durable save.
            assert "signal" in [e.trigger for e in saves]
            assert row["lost_work"] == pytest.approx(end - saves[-1].t, abs=1e-5)
            assert row["lost_work"] < 5.0  # the signal save came right before the end
            nxt = first(events, "run_started", a + 1).t
            assert row["requeue_wait"] == pytest.approx(nxt - end, abs=1e-5)
            assert row["requeue_wait"] > 0
        else:
            assert (row["lost_work"], row["requeue_wait"]) == (0.0, 0.0)
    for key in ("wall_s", "productive_s"):
        assert g[key] == pytest.approx(sum(a[key] for a in rows), abs=1e-5)
    for cause, total in g["badput_s"].items():
        assert total == pytest.approx(sum(a["badput_s"][cause] for a in rows), abs=1e-5)
    assert 0 < g["goodput"] < 1
    MEASUREMENTS.append(
        (
            "goodput, Lightning job preempted twice",
            {"wall": g["wall_s"], **{k: v for k, v in g["badput_s"].items() if v}},
        )
    )
