"""Real SLURM: the dashboard's scheduler panel and its Hold / Release / Cancel pending job
buttons, and its Suspend auto-requeue toggle mirrored onto the job (Requeue=0/1).

The run directory is what ckptdash leaves once it requeued a job (attempt 0 of SLURM job J
saved, requeued and ended); J itself is a real job that waits in the queue: submitted held,
with a begin time an hour away so that releasing it keeps it pending (BeginTime) instead of
starting it. The Dashboard object is driven as a browser would click it (no browser needed),
and ``squeue``/``scontrol`` — the harness's own parser, not ckptdash's — confirm each click.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ckptdash import events
from ckptdash.dash.app import Dashboard, DashOptions
from ckptdash.dash.feed.hub import FollowerHub
from ckptdash.dash.views.widgets import button_label
from ckptdash.rundir.writer import EventWriter
from ckptdash.schedulers.slurm_queue import HOLD_REASONS
from tests.slurm.harness import Cluster, Scenario, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]


def requeued_run(root: Path, job_id: str) -> Path:
    """A run whose attempt 0, SLURM job ``job_id``, saved on a signal and requeued the job."""
    with EventWriter(root, attempt=0, host="node1") as w:
        w.emit(events.RunStarted, scheduler="slurm", job_id=job_id, max_steps=100)
        w.emit(events.SignalReceived, step=40, signal="SIGUSR2", action="requeue")
        w.emit(
            events.CheckpointSaved,
            step=40,
            path=str(root / "ck-40.pt"),
            trigger="signal",
            size_bytes=100,
            duration_s=0.5,
        )
        w.emit(events.RequeueIssued, step=40, job_id=job_id, command=f"scontrol requeue {job_id}")
        w.emit(events.RunFinished, step=40, reason="preempted")
    return root


@pytest.fixture
def held_job(slurm_cluster: Cluster, tmp_path: Path) -> Iterator[tuple[Scenario, str]]:
    """A real job waiting in the queue, held since submission; cancelled afterwards."""
    s = Scenario(slurm_cluster, tmp_path, "dashboard")
    job = s.sbatch(["-c", "pass"], "--hold", "--begin=now+3600")
    yield s, job.job_id
    slurm_cluster.run("scancel", job.job_id, check=False)


@pytest.fixture
def dashboard(held_job: tuple[Scenario, str]) -> Iterator[Dashboard]:
    s, job = held_job
    hub = FollowerHub()
    d = Dashboard(requeued_run(s.root / "run", job), options=DashOptions(watch="poll"), hub=hub)
    try:
        yield d
    finally:
        d.close()
        hub.close()


def _click(d: Dashboard, widget: Any) -> None:
    with d.holding_updates():  # between two updates, as a browser's click lands
        widget.clicks += 1


def _wait(d: Dashboard, s: Scenario, condition: Callable[[], Any], what: str) -> Any:
    def applied() -> Any:
        with d.holding_updates():  # a refresh is applied whole under this lock
            return condition()

    return wait_for(applied, 30.0, f"dashboard: {what}", s.context)


def _buttons(d: Dashboard) -> tuple[bool, bool, bool]:
    p = d.scheduler
    return (
        not p.hold_button.disabled,
        not p.release_button.disabled,
        not p.cancel_job_button.disabled,
    )


def test_dashboard_shows_and_steers_a_pending_job_on_real_slurm(
    dashboard: Dashboard, held_job: tuple[Scenario, str]
) -> None:
    """The panel shows the requeued job as SLURM sees it — PENDING, its hold reason, held —
    next to the run's own "requeue pending"; Release, Hold and (confirmed) Cancel pending job
    act on the real scheduler, and the Suspend toggle sets the job's Requeue flag, as squeue and
    scontrol confirm after each click."""
    d = dashboard
    s, job = held_job
    cluster = s.cluster
    message = lambda: str(d.controls.message.object)  # noqa: E731

    # Held since submission: shown with SLURM's own reason; only Release and Cancel make sense.
    state, reason = cluster.squeue(job) or ("gone", "")
    assert (state, reason in HOLD_REASONS) == ("PENDING", True)
    _wait(d, s, lambda: d.scheduler.info.view is not None, "SLURM's first answer")
    html = d.scheduler.status.object
    for text in (f"SLURM job {job}", "PENDING", reason, "<b>held</b>", "restarts 0"):
        assert text in html, text
    assert "requeue pending" in d.header._pane.object  # the run's own events, next to it
    assert _buttons(d) == (False, True, True)

    # Release: still pending (its begin time is an hour away), no longer held.
    # A click hands the command to the panel's thread; the message line shows SLURM's answer.
    _click(d, d.scheduler.release_button)
    _wait(d, s, lambda: f"slurm job {job}: released" in message(), "Release answered")
    state, reason = cluster.squeue(job) or ("gone", "")
    assert state == "PENDING"
    assert reason not in HOLD_REASONS  # None until the next scheduling pass, then BeginTime
    _wait(d, s, lambda: _buttons(d) == (True, False, True), "Hold and Cancel enabled")

    # Hold: held again, by the scheduler.
    _click(d, d.scheduler.hold_button)
    _wait(d, s, lambda: f"slurm job {job}: held" in message(), "Hold answered")
    state, reason = cluster.squeue(job) or ("gone", "")
    assert state == "PENDING"
    assert reason in HOLD_REASONS
    assert cluster.job(job)["Reason"] == reason
    _wait(d, s, lambda: _buttons(d) == (False, True, True), "Release and Cancel enabled")
    _wait(d, s, lambda: reason in d.scheduler.status.object, "the hold reason shown")

    # Suspend auto-requeue: the run's setting, and Requeue=0 on the job; Resume: Requeue=1.
    _click(d, d.controls.requeue_button)
    suspended = f"auto-requeue suspended; slurm job {job}: Requeue=0 ("
    _wait(d, s, lambda: suspended in message(), "Requeue=0 answered")
    assert cluster.job(job)["Requeue"] == "0"
    _wait(
        d,
        s,
        lambda: button_label(d.controls.requeue_button) == "Allow auto-requeue",
        "the suspended setting read back",
    )
    _wait(d, s, lambda: "requeue off" in d.scheduler.status.object, "Requeue=0 shown")
    _click(d, d.controls.requeue_button)
    resumed = f"auto-requeue resumed; slurm job {job}: Requeue=1 ("
    _wait(d, s, lambda: resumed in message(), "Requeue=1 answered")
    assert cluster.job(job)["Requeue"] == "1"

    # Cancel pending job: nothing happens until confirmed; then SLURM cancels it.
    _click(d, d.scheduler.cancel_job_button)
    assert d.scheduler.confirm_row.visible
    assert (cluster.squeue(job) or ("gone",))[0] == "PENDING"
    _click(d, d.scheduler.confirm_cancel_button)
    _wait(d, s, lambda: f"slurm job {job}: cancelled while pending" in message(), "the cancel")
    assert cluster.job(job)["JobState"] == "CANCELLED"
    assert cluster.squeue(job) in (None, ("CANCELLED", "None"))
    _wait(d, s, lambda: _buttons(d) == (False, False, False), "every button off")
    _wait(d, s, lambda: "CANCELLED" in d.scheduler.status.object, "the cancelled job shown")
