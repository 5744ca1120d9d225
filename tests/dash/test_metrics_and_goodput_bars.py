"""The goodput bars, the metrics plot and the metrics column, without a server: what they
show for a hand-fed run, and that a point chosen on the plot pins through the controls."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

from ckptdash import control, events
from ckptdash.dash.app import Dashboard, DashOptions
from ckptdash.dash.feed.hub import FollowerHub
from ckptdash.dash.model import DashModel
from ckptdash.dash.views import RunList
from ckptdash.dash.views.checkpoints import checkpoint_frame
from ckptdash.dash.views.goodput_bars import of_snapshot, render_badput
from ckptdash.dash.views.metrics import (
    choose,
    metric_names,
    metrics_at_save,
    metrics_data,
    render_anomalies,
)
from ckptdash.state import RunState
from ckptdash.state.series import SERIES_POINTS
from tests.dash.conftest import T0, Scenario, ev, preempted_run, saved

WaitUntil = Callable[..., None]


def losses() -> list[events.Event]:
    """Attempt 0 trains with a falling loss and saves at steps 100 and 200; the loss is NaN at
    step 250 (the writer stores a non-finite number as null); attempt 1 resumes."""
    out: list[events.Event] = [ev(events.RunStarted, 0)]
    for step in range(0, 250, 10):
        metrics = {"loss": 2.0 / (1 + step), "acc": step / 250, "lr": 0.1}
        out.append(ev(events.Heartbeat, 10 + step, step=step, metrics=metrics))
    out.append(ev(events.Heartbeat, 260, step=250, metrics={"loss": math.nan, "lr": 0.1}))
    out += [saved(105, "/ck/100", 100), saved(205, "/ck/200", 200)]
    reason = "loss is nan (not finite)"
    out.append(ev(events.AnomalyDetected, 261, step=250, metric="loss", value=None, reason=reason))
    out += [ev(events.RunStarted, 400, attempt=1), ev(events.Heartbeat, 410, attempt=1, step=201)]
    return out


def test_bars_show_the_run_and_each_attempt_with_the_same_numbers_as_the_cli(
    scenario: Scenario,
) -> None:
    """One bar for the run and one per attempt; a segment's tooltip gives the cause's time,
    and the run's goodput is badput's (the numbers `ckptdash goodput` prints)."""
    scenario.add(*preempted_run())
    snap = scenario.snapshot()
    g = of_snapshot(snap, T0 + 620)
    assert (g.wall_s, g.productive_s) == (620.0, 347.0)
    html = render_badput(g)
    assert html.count('class="gp-row"') == 4
    assert "goodput <b class='gp-run'>56.0 %</b>" in html
    assert 'title="lost work: 1 min 00 s (30.0 %)"' in html  # attempt 1: 60 s of 200 s
    assert "most lost to <b>startup</b>" in html


def test_the_runs_list_has_a_goodput_column(scenario: Scenario) -> None:
    """Each run's row carries its goodput now (0–1, shown as a percentage)."""
    scenario.add(*preempted_run())
    model = DashModel(path="/runs")
    model.publish(scenario.folder(T0 + 620))
    (row,) = RunList(model).frame().to_dict("records")
    assert row["goodput"] == of_snapshot(model.run, T0 + 620).goodput == 0.559677


def test_metric_names_put_the_loss_first_and_the_plot_skips_non_finite_values() -> None:
    """``loss`` is the default metric; the NaN at step 250 is no point (and no line to it);
    each save sits on the curve at the value nearest its step; log scale drops values ≤ 0;
    the anomaly and the resume pin are marked."""
    state = RunState("/r", "r1")
    state.apply_events(losses())
    snap = Scenario(state=state).snapshot()
    assert metric_names(snap) == ["loss", "acc", "lr"]
    d = metrics_data(snap, "loss")
    assert [len(xs) for xs in d["lines"]["xs"]] == [25]  # attempt 1's only heartbeat: no loss
    assert max(d["lines"]["xs"][0]) == 240
    assert d["saves"]["x"] == [200, 100]
    assert d["saves"]["y"] == [2.0 / 201, 2.0 / 101]
    assert metrics_data(snap, "acc", log=True)["lines"]["xs"][0][0] == 10  # acc 0 at step 0
    # The NaN anomaly is marked at step 250, at the height of the last finite loss.
    assert (d["anomalies"]["x"], d["anomalies"]["y"]) == ([250], [2.0 / 241])
    assert "anomaly</b> at step 250 (attempt 0): loss is nan (not finite) — recorded" in (
        render_anomalies(snap)
    )
    pinned = metrics_data(Scenario(state=state).snapshot(resume_pin="/ck/100"), "loss")
    assert (pinned["pin"]["x"], pinned["pin"]["y"]) == ([100], [2.0 / 101])


def test_a_click_chooses_the_nearest_valid_checkpoint() -> None:
    """Clicking at a step chooses the valid checkpoint nearest it; the newer one on a tie."""
    state = RunState("/r", "r1")
    state.apply_events(losses())
    snap = Scenario(state=state).snapshot()
    assert [choose(snap, x).path for x in (0, 149, 150, 190, 1e9)] == [  # type: ignore[union-attr]
        "/ck/100",
        "/ck/100",
        "/ck/200",
        "/ck/200",
        "/ck/200",
    ]
    assert choose(snap, math.nan) is None


def test_the_table_shows_the_metrics_nearest_each_save(scenario: Scenario) -> None:
    """Each checkpoint row carries the metrics of the heartbeat nearest its step, and says the
    heartbeat's step when it is not the save's."""
    scenario.state.apply_events(losses())
    snap = scenario.snapshot()
    frame = checkpoint_frame(snap)
    assert list(frame["metrics"]) == [
        "loss 0.0100 · acc 0.8000 · lr 0.1000",
        "loss 0.0198 · acc 0.4000 · lr 0.1000",
    ]
    late = SimpleNamespace(step=104, attempt=0, monitored=None)
    assert metrics_at_save(snap, late).endswith("(step 100)")  # type: ignore[arg-type]


def test_metric_points_are_the_thinned_progress_points_with_their_metrics() -> None:
    """A long attempt keeps at most SERIES_POINTS metric points, spread over its whole time,
    each the heartbeat behind a progress point."""
    state = RunState("/r", "r1")
    n = SERIES_POINTS * 3
    state.apply_events(
        [ev(events.Heartbeat, i, step=i, metrics={"loss": 1.0 / (1 + i)}) for i in range(n)]
    )
    (points,) = state.metrics().values()
    assert len(points) <= SERIES_POINTS
    assert [(p.t, p.step) for p in points] == state.series[0]
    assert (points[0].step, points[0].metrics) == (0, {"loss": 1.0})
    assert points[-1].step >= n - 4


def test_choosing_on_the_plot_pins_through_the_controls(
    make_run: Callable[..., Path], hub: FollowerHub, wait_until: WaitUntil
) -> None:
    """A tap at a step chooses a checkpoint; the plot's button writes it as the resume pin."""
    # The run declared its /ck folder: its checkpoints there count (docs/format.md).
    root = make_run(evs=[*losses(), ev(events.CheckpointDirDeclared, 0, path="/ck")])
    d = Dashboard(root, options=DashOptions(watch="inotify"), hub=hub)
    try:
        wait_until(lambda: d.metrics.select.value == "loss", what="the metrics plot")
        assert d.metrics.pin_button.disabled
        with d.holding_updates():
            d.metrics._on_tap(SimpleNamespace(x=120.0))
        assert d.metrics.chosen is not None and d.metrics.chosen.path == "/ck/100"
        with d.holding_updates():
            d.metrics.pin_button.clicks += 1
        wait_until(lambda: control.read_settings(root).resume_pin == "/ck/100", what="the pin")
    finally:
        d.close()


def test_artifacts_are_marked_in_the_table_and_never_offered_on_the_plot() -> None:
    """A weights-only save (``artifact``) and a link to a save (``same_as``): the checkpoint
    table's ``kind`` column tells them from checkpoints that resume, the plot draws neither
    for clicking, a click near them chooses the nearest checkpoint that resumes, and they
    are no pin target."""
    state = RunState("/r", "r1")
    weights = "weights only (save_weights_only=True): no optimizer or callback state"
    state.apply_events(
        [
            *losses(),
            saved(215, "/ck/best-210", 210, artifact=weights),
            saved(216, "/ck/last", 200, same_as="/ck/200"),
        ]
    )
    snap = Scenario(state=state).snapshot()
    frame = checkpoint_frame(snap).set_index("path")
    assert list(frame.loc[["/ck/200", "/ck/best-210", "/ck/last"], "kind"]) == [
        "resumes",
        "artifact",
        "= 200",
    ]
    assert sorted(metrics_data(snap, "loss")["saves"]["path"]) == ["/ck/100", "/ck/200"]
    assert choose(snap, 210).path == "/ck/200"  # type: ignore[union-attr]
    assert snap.valid_paths() == {"/ck/100", "/ck/200", "/ck/last"}
