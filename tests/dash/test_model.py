"""The dashboard's model: snapshots, the status word, speed and clocks, the per-session model."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import ckptdash
from ckptdash import events
from ckptdash.dash.model import DashModel, rates, run_status
from tests.dash.conftest import T0, Scenario, ev, preempted_run


def test_importing_ckptdash_and_the_plain_parts_does_not_import_panel() -> None:
    """`import ckptdash` and the model, goodput and follower modules never load Panel or Bokeh;
    `ckptdash.dashboard` loads it on first use."""
    code = (
        "import sys, ckptdash, ckptdash.dash, ckptdash.dash.model, ckptdash.analysis.preemption,"
        " ckptdash.dash.feed.follow, ckptdash.dash.feed.hub\n"
        "assert 'panel' not in sys.modules and 'bokeh' not in sys.modules, 'panel imported'\n"
        "assert callable(ckptdash.dashboard) and 'panel' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_dashboard_never_imports_the_training_side() -> None:
    """ckptdash.dash and ckptdash.train are two wings: no dash module imports train/lightning."""
    for path in sorted((Path(ckptdash.__file__).parent / "dash").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            bad = [n for n in names if n.startswith(("ckptdash.train", "ckptdash.lightning"))]
            assert not bad, f"{path.name} imports {bad}"


@pytest.mark.parametrize(
    ("tail", "now", "status"),
    [
        ([], T0 + 620, "running"),
        ([], T0 + 620 + 1000, "stale"),
        ([ev(events.RunFinished, 620, attempt=2, step=1000)], T0 + 700, "finished"),
        ([ev(events.RunFailed, 620, attempt=2, error="OOM")], T0 + 700, "failed"),
        (
            [
                ev(events.SignalReceived, 615, attempt=2, signal="SIGTERM", action="terminate"),
                ev(events.RunFinished, 620, attempt=2, reason="terminated"),
            ],
            T0 + 700,
            "terminated",
        ),
        (
            [
                ev(events.SignalReceived, 615, attempt=2, signal="SIGUSR2", action="requeue"),
                ev(events.RunFinished, 620, attempt=2, reason="preempted"),
            ],
            T0 + 700,
            "preempted",
        ),
        (
            [
                ev(events.SignalReceived, 615, attempt=2, signal="SIGUSR2", action="requeue"),
                ev(events.RequeueIssued, 619, attempt=2, job_id="77"),
                ev(events.RunFinished, 620, attempt=2, reason="preempted"),
            ],
            T0 + 700,
            "requeue pending",
        ),
        (
            [ev(events.RunFinished, 620, attempt=2, reason="stopped by command")],
            T0 + 700,
            "stopped",
        ),
    ],
)
def test_status_word(scenario: Scenario, tail: list[events.Event], now: float, status: str) -> None:
    """The header's one word follows the newest attempt: running, stale after silence, finished,
    failed, terminated (SIGTERM: Ctrl-C, scancel, a time limit), preempted (the requeue
    signal, not requeued), requeue pending, stopped."""
    scenario.add(*preempted_run(), *tail)
    word, why = run_status(scenario.snapshot(), now, stale_after_s=120)
    assert word == status
    assert why


def test_status_of_a_run_without_attempts_is_waiting() -> None:
    """No snapshot or no attempt yet: waiting."""
    assert run_status(None, T0)[0] == "waiting"


def test_preempted_but_not_requeued_says_why(scenario: Scenario) -> None:
    """A preemption whose requeue was refused says the refusal's reason."""
    scenario.add(
        *preempted_run(),
        ev(events.SignalReceived, 615, attempt=2, signal="SIGUSR2", action="requeue"),
        ev(events.RequeueSkipped, 619, attempt=2, reason="suspended by alice"),
        ev(events.RunFinished, 620, attempt=2, reason="preempted"),
    )
    word, why = run_status(scenario.snapshot(), T0 + 700)
    assert word == "preempted"
    assert "suspended by alice" in why


def test_rates_speed_eta_and_time_left(scenario: Scenario) -> None:
    """Steps/s comes from the newest attempt's progress, ETA from max_steps, and the time left
    counts down from the last heartbeat's figure."""
    scenario.add(*preempted_run())
    r = rates(scenario.snapshot(), T0 + 630)
    assert r.step == 450
    assert r.max_steps == 1000
    assert r.fraction == pytest.approx(0.45)
    assert r.steps_per_s == pytest.approx(1.0)
    assert r.eta_s == pytest.approx(550.0)
    assert r.time_left_s == pytest.approx(3500.0 - 20)


def test_rates_of_a_finished_run_have_no_eta(scenario: Scenario) -> None:
    """Once the attempt ended there is no ETA and no time left."""
    scenario.add(*preempted_run(), ev(events.RunFinished, 620, attempt=2, step=450))
    r = rates(scenario.snapshot(), T0 + 630)
    assert r.eta_s is None
    assert r.time_left_s is None


def test_model_ignores_an_older_snapshot(scenario: Scenario) -> None:
    """Snapshots can arrive from two threads; an older one never replaces a newer one."""
    scenario.add(*preempted_run())
    model = DashModel(path="/runs/exp1")
    old = scenario.folder(T0 + 620)
    new = scenario.folder(T0 + 621)
    model.publish(new)
    model.publish(old)
    assert model.now == T0 + 621
    assert model.run is new.runs[0]
    assert model.selected == "/runs/exp1"


def test_model_sets_run_only_when_it_changed(scenario: Scenario) -> None:
    """A clock tick moves `now` but does not re-announce the same run to the views."""
    scenario.add(*preempted_run())
    model = DashModel(path="/runs/exp1")
    model.publish(scenario.folder(T0 + 620))
    seen: list[str] = []
    model.param.watch(lambda e: seen.append(e.name), ["run", "now"])
    model.publish(scenario.folder(T0 + 621))
    assert seen == ["now"]


def test_model_select_refuses_an_unknown_run(scenario: Scenario) -> None:
    """Selecting anything but a listed run is refused (the browser sends the selection)."""
    scenario.add(*preempted_run())
    model = DashModel(path="/runs/exp1")
    model.publish(scenario.folder(T0 + 620))
    with pytest.raises(ValueError, match="not a run"):
        model.select("/etc")
    assert model.selected == "/runs/exp1"
