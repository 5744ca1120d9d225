"""Run snapshots: immutable, and rebuilt only in the parts that changed."""

from __future__ import annotations

from ckptdash import events
from tests.dash.conftest import Scenario, ev, preempted_run, saved


def test_snapshot_is_reused_when_nothing_changed(scenario: Scenario) -> None:
    """Taking a snapshot twice without new records returns the same object."""
    scenario.add(*preempted_run())
    first = scenario.snapshot()
    assert scenario.snapshot() is first


def test_a_heartbeat_keeps_the_checkpoint_tuple(scenario: Scenario) -> None:
    """A heartbeat makes a new snapshot but reuses the checkpoint and command tuples, so the
    table can skip its work with an identity test."""
    scenario.add(*preempted_run())
    first = scenario.snapshot()
    scenario.add(ev(events.Heartbeat, 700, attempt=2, step=540))
    second = scenario.snapshot()
    assert second is not first
    assert second.version == first.version + 1
    assert second.checkpoints is first.checkpoints
    assert second.commands is first.commands
    assert second.series is not first.series
    scenario.add(saved(710, "/ck/d.ckpt", 550, attempt=2))
    assert scenario.snapshot().checkpoints is not first.checkpoints


def test_snapshot_orders_checkpoints_newest_first_and_copies_attempts(scenario: Scenario) -> None:
    """Checkpoints come newest step first; attempts are copies the state cannot change later."""
    scenario.add(*preempted_run())
    snap = scenario.snapshot()
    assert [c.step for c in snap.checkpoints] == [350, 250, 200, 100]
    step_before = snap.attempts[-1].step
    scenario.add(ev(events.Heartbeat, 700, attempt=2, step=999))
    scenario.snapshot()
    assert snap.attempts[-1].step == step_before


def test_settings_change_makes_a_new_snapshot(scenario: Scenario) -> None:
    """A new settings file alone (no event) is a change: the header must show it."""
    scenario.add(*preempted_run())
    first = scenario.snapshot()
    second = scenario.snapshot(requeue_suspended=True)
    assert second is not first
    assert second.settings is not None and second.settings.requeue_suspended
