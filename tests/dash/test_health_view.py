"""The dashboard's health views: the alert banner and the ranks by node (dash.health_view)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ckptdash import events
from ckptdash.dash.app import Dashboard, DashOptions
from ckptdash.dash.feed.hub import FollowerHub
from ckptdash.dash.views.health import render_banner, render_ranks
from ckptdash.rundir.writer import EventWriter
from tests.dash.conftest import T0, Scenario, ev


def pulse(t: float, rank: int, host: str, step: int) -> events.Event:
    return events.Pulse(t=T0 + t, run="r1", attempt=0, rank=rank, host=host, step=step)


def four_ranks(scenario: Scenario, until: int) -> None:
    """Attempt 0 with ranks 0-1 on node1 and 2-3 on node2, ten steps a second; rank 3 stops
    pulsing at t=20 (silent), rank 2 is 100 steps behind (a straggler)."""
    scenario.add(ev(events.RunStarted, 0, scheduler="slurm", job_id="77", world_size=4))
    for t in range(until + 1):
        for rank, host in ((0, "node1"), (1, "node1"), (2, "node2")):
            behind = 100 if rank == 2 else 0
            scenario.add(pulse(t, rank, host, max(0, 10 * t - behind)))
        if t <= 20:
            scenario.add(pulse(t, 3, "node2", 10 * t))


def test_ranks_grouped_by_node_with_straggler_and_silent_marked(scenario: Scenario) -> None:
    """Ranks show under their node with their step; the rank 100 steps (10 s) behind is a
    straggler, the one whose pulses stopped 30 s ago is silent, the others are unmarked."""
    four_ranks(scenario, until=50)
    html = render_ranks(scenario.snapshot(), now=T0 + 50)
    assert html.index("node1") < html.index('data-rank="0"') < html.index('data-rank="1"')
    assert html.index("node2") < html.index('data-rank="2"')
    assert 'data-rank="2" data-mark="straggler"' in html
    assert 'data-rank="3" data-mark="silent"' in html
    assert 'data-rank="0" data-mark=""' in html
    assert "4 rank(s) on 2 node(s)" in html and "1 silent, 1 straggler(s)" in html


def test_banner_lists_alerts_as_the_clock_moves(scenario: Scenario) -> None:
    """No banner while the run advances; the same snapshot shows stale once the clock passes
    the run's own stale_after_s (a setting), without any new event."""
    four_ranks(scenario, until=20)
    snap = scenario.snapshot(health={"stale_after_s": 60.0})
    assert render_banner(snap, now=T0 + 21) == ""
    html = render_banner(snap, now=T0 + 100)
    assert 'data-alert="stale"' in html and "wrote nothing for 80 s" in html


def test_dashboard_and_widget_show_the_banner_and_ranks(
    tmp_path: Path, hub: FollowerHub, wait_until: Callable[..., None]
) -> None:
    """The Dashboard (served page and notebook widget alike) shows a hung run's banner and its
    ranks by node, from the run directory."""
    root = tmp_path / "run"
    now = time.time()
    for rank, host in ((0, "node1"), (1, "node2")):
        with EventWriter(root, attempt=0, rank=rank, host=host) as w:
            if rank == 0:
                w.emit(events.RunStarted, t=now - 400, scheduler="local", world_size=2)
            for i in range(0, 400, 5):
                w.emit(events.Pulse, t=now - 400 + i, step=min(i, 50))
    d = Dashboard(root, options=DashOptions(watch="poll", poll_interval_s=0.2), hub=hub)
    try:
        wait_until(lambda: 'data-alert="hung"' in d.alerts._pane.object, what="the hung banner")
        # The two views redraw one after the other from the same snapshot: wait for the second.
        wait_until(lambda: "Ranks of attempt 0" in d.ranks._pane.object, what="the ranks")
        ranks = d.ranks._pane.object
        assert "node1" in ranks and "node2" in ranks
    finally:
        d.close()


def test_a_wide_run_shows_one_line_a_node_and_its_marked_ranks_only() -> None:
    """1,024 ranks on 128 nodes: one line per node (its ranks' step range) and a chip only for
    the silent rank and the straggler — a page of 128 lines, not 1,024 chips — and the clock
    moving with nothing else changing gives the same HTML (nothing re-sent every second)."""
    scenario = Scenario()
    scenario.add(ev(events.RunStarted, 0, scheduler="slurm", job_id="77", world_size=1024))
    for t in range(0, 50, 5):
        for rank in range(1024):
            host = f"node{rank // 8:03d}"
            if rank == 1000 and t > 20:
                continue  # silent since t=20
            behind = 500 if rank == 7 else 0
            scenario.add(pulse(t, rank, host, max(0, 10 * t - behind)))
    snap = scenario.snapshot()
    html = render_ranks(snap, now=T0 + 50)
    assert html.count("<tr>") == 1 + 128 and len(html) < 40_000, len(html)
    assert html.count('class="rank"') == 2
    assert 'data-rank="7" data-mark="straggler"' in html
    assert 'data-rank="1000" data-mark="silent"' in html
    assert "8 ranks, steps 450–450" in html
    assert render_ranks(snap, now=T0 + 51) == html
