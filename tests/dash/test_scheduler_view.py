"""The scheduler panel without a server or SLURM: a fake runner stands in for scontrol/scancel
(edge cases only; tests/slurm/test_dashboard_controls.py drives the real scheduler).

It checks which buttons a job's state enables, that clicks call SLURM's commands (the cancel
only after confirmation) without waiting for them, that a missing ``scontrol`` is said once, and
that the Suspend auto-requeue toggle is mirrored onto the job as Requeue=0/1.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ckptdash import control, events
from ckptdash.dash.app import Dashboard, DashOptions
from ckptdash.dash.feed.hub import FollowerHub
from ckptdash.dash.feed.snapshot import SnapshotBuilder
from ckptdash.dash.model import DashModel
from ckptdash.dash.views import scheduler
from ckptdash.dash.views.controls import ControlActions, Controls
from ckptdash.dash.views.scheduler import UNAVAILABLE, SchedulerPanel
from ckptdash.rundir import RunDir
from ckptdash.rundir.writer import EventWriter
from ckptdash.state import RunState
from tests.dash.conftest import T0, Scenario, ev, preempted_run

WaitUntil = Callable[..., None]


GATE_S = 300.0
"""The longest a command waits at a shut gate: only a failing test gets there."""


class FakeRunner:
    """scontrol/scancel over a job table ``{job: {JobState, Reason, Requeue, Restarts}}``;
    records every argv. Thread-safe: the panel's thread and the clicks both call it."""

    def __init__(self, **jobs: dict[str, str]) -> None:
        self.jobs = jobs
        self.calls: list[list[str]] = []
        self.missing = False  # raise like a command not on PATH
        self.update_fails = False
        self.gate = threading.Event()  # commands other than `show job` wait for it
        self.gate.set()
        self.at_gate: list[list[str]] = []  # the commands that reached the gate, shut or open
        self._lock = threading.Lock()

    def __call__(self, argv: Sequence[str], timeout_s: float) -> tuple[int, str]:
        if list(argv[:3]) != ["scontrol", "show", "job"]:
            # A slow controller, when a test closes the gate: shut until the test opens it.
            # Not for the command's timeout_s (10 s): a CI run took longer than that between
            # closing the gate and its next click, so the held command had already "answered".
            self.at_gate.append(list(argv))
            self.gate.wait(GATE_S)
        with self._lock:
            self.calls.append(list(argv))
            if self.missing:
                raise FileNotFoundError(argv[0])
            return self._answer(list(argv))

    def _answer(self, argv: list[str]) -> tuple[int, str]:
        job = argv[-1].removeprefix("JobId=") if argv[1] != "update" else argv[2][6:]
        j = self.jobs.get(job)
        if j is None:
            return 1, "slurm_load_jobs error: Invalid job id specified"
        if argv[:3] == ["scontrol", "show", "job"]:
            fields = " ".join(f"{k}={v}" for k, v in j.items() if k != "UserId")
            # RunTime changes with every look, as on a real cluster: the page must not.
            runtime = f"RunTime=00:00:{len(self.calls) % 60:02d}"
            user = j.get("UserId", f"me({os.geteuid()})")  # the page owner's unless set
            return 0, f"JobId={job} JobName=train UserId={user} {fields} BatchFlag=1 {runtime}"
        if argv[:2] == ["scontrol", "hold"]:
            j["Reason"] = "JobHeldAdmin"
        elif argv[:2] == ["scontrol", "release"]:
            j["Reason"] = "None"
        elif argv[0] == "scancel" and j["JobState"] == "PENDING":
            j["JobState"], j["Reason"] = "CANCELLED", "None"
        elif argv[:2] == ["scontrol", "update"]:
            if self.update_fails:
                return 1, "slurm_update error: Access/permission denied"
            j["Requeue"] = argv[3].split("=")[1]
        return 0, ""

    def count(self) -> int:
        with self._lock:
            return len(self.calls)

    def made(self, *argv: str) -> bool:
        with self._lock:
            return list(argv) in self.calls


def job(state: str, reason: str = "None", requeue: str = "1") -> dict[str, str]:
    return {"JobState": state, "Reason": reason, "Requeue": requeue, "Restarts": "1"}


@dataclass
class Page:
    """One session's model, controls and scheduler panel on a real run directory."""

    root: Path
    runner: FakeRunner
    model: DashModel = field(default_factory=lambda: DashModel(path="/"))
    lock: threading.RLock = field(default_factory=threading.RLock)
    scenario: Scenario = field(init=False)
    controls: Controls = field(init=False)
    panel: SchedulerPanel = field(init=False)

    def __post_init__(self) -> None:
        RunDir(self.root).ensure()  # the controls write the settings file into it
        root = str(self.root)
        self.scenario = Scenario(root, RunState(root, "r1"), SnapshotBuilder(root))
        self.model = DashModel(path=root)
        actions = ControlActions(
            self.model, mirror_requeue=lambda suspended: self.panel.mirror_requeue(suspended)
        )
        self.controls = Controls(self.model, actions)
        self.panel = SchedulerPanel(
            self.model, self.controls, render_lock=self.lock, runner=self.runner, interval_s=0.05
        )

    def publish(self, *evs: events.Event, **settings: Any) -> None:
        for e in evs:  # on disk too: the run's own run_started vouches for its job
            if isinstance(e, events.RunStarted):
                with EventWriter(self.root, attempt=e.attempt) as w:
                    w.emit(events.RunStarted, scheduler=e.scheduler, job_id=e.job_id)
        with self.lock:  # as Delivery does in a notebook
            self.scenario.add(*evs)
            self.model.publish(self.scenario.folder(T0 + 700, **settings))

    def click(self, widget: Any) -> None:
        with self.lock:  # a click lands between two refreshes, as on a served page
            widget.clicks += 1

    def buttons(self) -> tuple[bool, bool, bool]:
        """Which of Hold / Release / Cancel are enabled."""
        p = self.panel
        return (
            not p.hold_button.disabled,
            not p.release_button.disabled,
            not p.cancel_job_button.disabled,
        )

    @property
    def message(self) -> str:
        return str(self.controls.message.object)


@pytest.fixture
def page(tmp_path: Path) -> Iterator[Callable[..., Page]]:
    """``page(runner)``: a page on a run whose attempts ran as SLURM job 77; closed after."""
    made: list[Page] = []

    def make(runner: FakeRunner, evs: list[events.Event] | None = None) -> Page:
        p = Page(tmp_path / f"run{len(made)}", runner)
        made.append(p)
        p.publish(*(preempted_run() if evs is None else evs))
        return p

    yield make
    for p in made:
        p.panel.close()


def _asked(p: Page, wait_until: WaitUntil) -> None:
    def asked() -> bool:
        with p.lock:  # an answer is applied whole under the lock: never half-seen
            return p.panel.info.asked

    wait_until(asked, timeout=5, what="the first answer from SLURM")


def _said(p: Page, wait_until: WaitUntil, text: str) -> None:
    """Wait until the message line holds SLURM's answer to a click (``text`` in it)."""

    def said() -> bool:
        with p.lock:
            return text in p.message

    wait_until(said, timeout=5, what=f"{text!r} in the message line")


@pytest.mark.parametrize(
    ("state", "reason", "enabled", "shown"),
    [
        ("PENDING", "BeginTime", (True, False, True), ["PENDING", "BeginTime"]),
        ("PENDING", "JobHeldAdmin", (False, True, True), ["PENDING", "JobHeldAdmin", "held"]),
        ("RUNNING", "None", (False, False, False), ["RUNNING"]),
        ("COMPLETED", "None", (False, False, False), ["COMPLETED"]),
    ],
)
def test_buttons_follow_the_scheduler_view(
    page: Callable[..., Page],
    wait_until: WaitUntil,
    state: str,
    reason: str,
    enabled: tuple[bool, bool, bool],
    shown: list[str],
) -> None:
    """Hold only a pending job that is not held, Release only a held one, Cancel only a pending
    one; the panel shows the job, its state, reason, hold and restart count."""
    p = page(FakeRunner(**{"77": job(state, reason)}))
    _asked(p, wait_until)
    assert p.buttons() == enabled
    html = p.panel.status.object
    for text in ["SLURM job 77", *shown, "restarts 1"]:
        assert text in html, text
    assert ("<b>held</b>" in html) == (reason == "JobHeldAdmin")
    assert p.panel.__panel__().visible


def test_a_job_slurm_forgot_shows_so_and_enables_nothing(
    page: Callable[..., Page], wait_until: WaitUntil
) -> None:
    p = page(FakeRunner())
    _asked(p, wait_until)
    assert "no longer known to SLURM" in p.panel.status.object
    assert p.buttons() == (False, False, False)


def test_hold_release_and_confirmed_cancel_call_slurm(
    page: Callable[..., Page], wait_until: WaitUntil
) -> None:
    """Each button runs its SLURM command and says the outcome in the controls' message line;
    Cancel pending job runs nothing until confirmed, and "Keep it" runs nothing at all."""
    runner = FakeRunner(**{"77": job("PENDING", "BeginTime")})
    p = page(runner)
    _asked(p, wait_until)

    p.click(p.panel.hold_button)
    _said(p, wait_until, "slurm job 77: held (PENDING (JobHeldAdmin), held")
    assert runner.made("scontrol", "hold", "77")
    with p.lock:
        assert p.buttons() == (False, True, True)  # with the answer, not at the next refresh

    p.click(p.panel.release_button)
    _said(p, wait_until, "slurm job 77: released (PENDING")
    assert runner.made("scontrol", "release", "77")
    with p.lock:
        assert p.buttons() == (True, False, True)

    p.click(p.panel.cancel_job_button)
    assert p.panel.confirm_row.visible
    p.click(p.panel.keep_button)
    assert not p.panel.confirm_row.visible
    assert not any(c[0] == "scancel" for c in runner.calls)

    p.click(p.panel.cancel_job_button)
    p.click(p.panel.confirm_cancel_button)
    _said(p, wait_until, "slurm job 77: cancelled while pending (CANCELLED")
    assert runner.made("scancel", "--state=PENDING", "77")
    with p.lock:
        assert p.buttons() == (False, False, False)
        assert not p.panel.confirm_row.visible


def test_a_click_returns_at_once_while_slurm_is_slow(
    page: Callable[..., Page], wait_until: WaitUntil
) -> None:
    """A click only hands its command to the panel's thread: with SLURM not answering, the
    click returns, the message says what is being asked and the buttons stay off; once SLURM
    answers, the message and the buttons show the outcome."""
    runner = FakeRunner(**{"77": job("PENDING", "BeginTime")})
    p = page(runner)
    _asked(p, wait_until)
    runner.gate.clear()
    # The click must come back while SLURM still does not answer (the gate stays shut until
    # after it has); a click that waited on SLURM would never come back. No time window: a busy
    # machine may take its time to run the click, not to be told it cannot go on.
    clicked = threading.Thread(target=p.click, args=(p.panel.hold_button,), daemon=True)
    clicked.start()
    clicked.join(timeout=120)
    assert not clicked.is_alive(), "the Hold click waited for SLURM to answer"
    with p.lock:
        assert "slurm job 77: asking SLURM to hold it" in p.message
        assert p.buttons() == (False, False, False)
    # The panel's thread has taken the hold and waits on SLURM: out of the queue, not answered.
    # (The second click was once refused only while the first was still queued; on a loaded
    # machine the thread had taken it, and the release went through.)
    wait_until(lambda: ["scontrol", "hold", "77"] in runner.at_gate, what="the hold sent")
    p.click(p.panel.release_button)  # a click the page let through before the buttons went off
    with p.lock:
        assert "SLURM has not answered the last click yet" in p.message
    runner.gate.set()
    _said(p, wait_until, "slurm job 77: held (PENDING (JobHeldAdmin), held")
    wait_until(lambda: p.buttons() == (False, True, True), timeout=5, what="the buttons")
    assert not runner.made("scontrol", "release", "77")


def test_a_refused_command_is_one_problem_line(
    page: Callable[..., Page], wait_until: WaitUntil
) -> None:
    """A job that started between the refresh and the click: the error names the job."""
    runner = FakeRunner(**{"77": job("PENDING", "Priority")})
    p = page(runner)
    _asked(p, wait_until)
    with p.lock:
        runner.jobs["77"]["JobState"] = "RUNNING"
        p.panel.hold_button.clicks += 1
    _said(p, wait_until, "slurm job 77 is RUNNING")
    assert "problem" in p.message
    assert not runner.made("scontrol", "hold", "77")
    # SLURM's view after the refusal: the buttons follow the running job.
    wait_until(lambda: "RUNNING" in p.panel.status.object, timeout=5, what="the running job")
    wait_until(lambda: p.buttons() == (False, False, False), timeout=5, what="the buttons")


def test_missing_scontrol_is_said_once_not_per_refresh(
    page: Callable[..., Page], wait_until: WaitUntil, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without SLURM's commands the panel says so once and enables nothing; further refreshes
    neither change the page nor put an error in the message line."""
    monkeypatch.setattr(scheduler, "UNAVAILABLE_RETRY_S", 0.01)
    runner = FakeRunner()
    runner.missing = True
    p = page(runner)
    renders: list[str] = []
    p.panel.status.param.watch(lambda e: renders.append(e.new), ["object"])
    wait_until(lambda: runner.count() >= 4, timeout=5, what="several refreshes")
    with p.lock:
        html = p.panel.status.object
    assert UNAVAILABLE in html
    assert "scontrol is not on PATH" in html
    assert len([r for r in renders if UNAVAILABLE in r]) <= 1  # 0: it was set before the watch
    assert p.buttons() == (False, False, False)
    assert p.message == ""


def test_dashboard_without_scontrol_on_path(
    make_run: Callable[..., Path],
    hub: FollowerHub,
    wait_until: WaitUntil,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real Dashboard, where no SLURM command exists: the panel says so, the toggle still
    suspends requeue (the run's own setting) and asks SLURM for nothing."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    d = Dashboard(make_run(), options=DashOptions(watch="inotify"), hub=hub)
    try:
        wait_until(lambda: UNAVAILABLE in d.scheduler.status.object, timeout=10, what="the panel")
        assert "scheduler commands not available here" in d.scheduler.status.object
        with d.holding_updates():
            d.controls.requeue_button.clicks += 1
        assert d.controls.message.object.endswith("auto-requeue suspended</div>")
        assert control.read_settings(d.path).requeue_suspended
    finally:
        d.close()


def test_a_run_without_slurm_hides_the_panel_and_asks_nothing(
    page: Callable[..., Page],
) -> None:
    runner = FakeRunner()
    local = [ev(events.RunStarted, 0, scheduler="local", job_id=None, max_steps=10)]
    p = page(runner, local)
    assert not p.panel.__panel__().visible
    assert p.panel._thread is None  # no thread, no scontrol for a run SLURM never ran
    p.click(p.controls.requeue_button)
    assert p.message.endswith("auto-requeue suspended</div>")
    assert runner.calls == []


def test_suspend_toggle_mirrors_requeue_onto_the_job(
    page: Callable[..., Page], wait_until: WaitUntil
) -> None:
    """Suspend auto-requeue sets the run's setting and Requeue=0 on the job, as the CLI's
    `requeue --suspend` does; Resume sets Requeue=1 again."""
    runner = FakeRunner(**{"77": job("RUNNING")})
    p = page(runner)
    _asked(p, wait_until)
    runner.gate.clear()  # SLURM answers only when the test says so
    p.click(p.controls.requeue_button)
    # The run's own setting at once; SLURM's flag by the panel's thread, the click not waiting.
    assert control.read_settings(p.root).requeue_suspended
    with p.lock:
        assert "auto-requeue suspended; slurm job 77: asking SLURM to set Requeue=0" in p.message
    runner.gate.set()
    _said(p, wait_until, "auto-requeue suspended; slurm job 77: Requeue=0 (RUNNING")
    assert runner.made("scontrol", "update", "JobId=77", "Requeue=0")

    p.publish(requeue_suspended=True)  # what the follower reads back from the settings file
    p.click(p.controls.requeue_button)
    assert not control.read_settings(p.root).requeue_suspended
    _said(p, wait_until, "auto-requeue resumed; slurm job 77: Requeue=1")
    assert runner.made("scontrol", "update", "JobId=77", "Requeue=1")
    wait_until(lambda: "requeue on" in p.panel.status.object, timeout=5, what="the new flag")


def test_a_refused_mirror_says_the_run_setting_changed_and_the_fix(
    page: Callable[..., Page], wait_until: WaitUntil
) -> None:
    runner = FakeRunner(**{"77": job("PENDING", "BeginTime")})
    runner.update_fails = True
    p = page(runner)
    _asked(p, wait_until)
    p.click(p.controls.requeue_button)
    assert control.read_settings(p.root).requeue_suspended  # the run's own setting holds
    _said(p, wait_until, "scontrol update JobId=77 Requeue=0")
    assert "problem" in p.message
    assert "setting is changed (auto-requeue suspended)" in p.message


def test_the_panel_follows_the_newest_attempts_job(
    page: Callable[..., Page], wait_until: WaitUntil
) -> None:
    """A new attempt under another job id (resubmitted by hand): the panel asks about it."""
    runner = FakeRunner(**{"77": job("COMPLETED"), "90": job("PENDING", "Priority")})
    p = page(runner)
    _asked(p, wait_until)
    p.publish(ev(events.RunStarted, 650, attempt=3, scheduler="slurm", job_id="90"))
    wait_until(lambda: "SLURM job 90" in p.panel.status.object, timeout=5, what="job 90")
    wait_until(lambda: p.buttons() == (True, False, True), timeout=5, what="job 90's buttons")


def test_buttons_refuse_another_users_job_and_say_why(
    page: Callable[..., Page], wait_until: WaitUntil
) -> None:
    """A run whose log names a job SLURM says is another account's: Hold, confirmed Cancel
    and the suspend mirror each run no SLURM command and say whose job it is, as a problem."""
    runner = FakeRunner(**{"77": {**job("PENDING", "BeginTime"), "UserId": "alice(4242)"}})
    p = page(runner)
    _asked(p, wait_until)
    with p.lock:
        assert p.buttons() == (False, False, False)  # off, and the panel says why
        assert "controls off: slurm job 77 belongs to alice" in p.panel.status.object
    p.click(p.panel.hold_button)  # a client can still send a click for a disabled button
    _said(p, wait_until, "slurm job 77 belongs to alice (uid 4242), not to you")
    assert "problem" in p.message
    p.click(p.panel.cancel_job_button)
    p.click(p.panel.confirm_cancel_button)
    wait_until(lambda: not p.panel._clicked, timeout=5, what="the cancel click handled")
    p.click(p.controls.requeue_button)
    _said(p, wait_until, "auto-requeue suspended; slurm job 77 belongs")
    assert [c for c in runner.calls if c[:3] != ["scontrol", "show", "job"]] == []
