"""The dashboard's small lies, fixed: the line under the buttons shows the job's answer,
Save now and Stop are off (with the reason) when no attempt could take a command, paths
read relative to the run, and a command's marker does not hide the save it caused."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ckptdash import control, events
from ckptdash.dash.app import Dashboard, DashOptions
from ckptdash.dash.feed.hub import FollowerHub
from ckptdash.dash.model import DashModel
from ckptdash.dash.views import render_commands
from ckptdash.dash.views.checkpoints import CheckpointTable
from ckptdash.dash.views.controls import ControlActions, Controls
from ckptdash.dash.views.timeline import Timeline
from ckptdash.rundir.writer import EventWriter
from tests.dash.conftest import T0, Scenario, ev, saved

WaitUntil = Callable[..., None]


@pytest.fixture
def live(tmp_path: Path, hub: FollowerHub, wait_until: WaitUntil) -> Iterator[Dashboard]:
    """A dashboard (no server) on a run whose attempt 0 is training now."""
    root = tmp_path / "exp1"
    with EventWriter(root, attempt=0, host="n0") as w:
        w.emit(events.RunStarted, max_steps=100)
        w.emit(events.Heartbeat, step=5)
    d = Dashboard(root, options=DashOptions(watch="inotify"), hub=hub)
    wait_until(lambda: d.model.run is not None, what="the first load")
    yield d
    d.close()


def _click(dash: Dashboard, button: object) -> None:
    with dash.holding_updates():
        button.clicks += 1  # type: ignore[attr-defined]


def _answer(root: Path, kind: type[events.Event], **fields: str) -> None:
    """What the job does with the one command in the inbox: claim it, answer it, file it."""
    (claimed,) = control.claim(root)
    with EventWriter(root, attempt=0, host="n0") as w:
        w.emit(kind, step=6, command_id=claimed.id, command=claimed.command_name, **fields)
    control.complete(root, claimed)


def test_the_line_under_the_buttons_shows_the_jobs_answer(
    live: Dashboard, wait_until: WaitUntil
) -> None:
    """After Save now the line says it waits for the answer; once the job applied it, the line
    says applied with the checkpoint's path relative to the run; a rejection shows its reason
    and an expiry says so — never "waiting" after the Commands table has the answer."""
    root = live.path
    message = live.controls.message
    _click(live, live.controls.save_button)
    assert "waiting for the job" in message.object
    _answer(root, events.CommandApplied, detail=str(root / "checkpoints" / "step=6-manual.ckpt"))
    wait_until(lambda: "applied" in message.object, timeout=10, what="the answer on the line")
    assert "Save now applied" in message.object
    assert "checkpoints/step=6-manual.ckpt" in message.object
    assert str(root) not in message.object
    assert "waiting" not in message.object

    _click(live, live.controls.save_button)
    _answer(root, events.CommandRejected, reason="not during validation")
    wait_until(lambda: "rejected" in message.object, timeout=10, what="the rejection")
    assert "not during validation" in message.object

    _click(live, live.controls.stop_button)
    _click(live, live.controls.confirm_button)
    _answer(root, events.CommandExpired, reason="expired before the job saw it")
    wait_until(lambda: "expired" in message.object, timeout=10, what="the expiry")
    assert "Stop after save expired" in message.object


def _controls(scenario: Scenario, now: float) -> Controls:
    model = DashModel(path=scenario.root)
    model.publish(scenario.folder(now))
    return Controls(model, ControlActions(model))


@pytest.mark.parametrize(
    ("end", "reason"),
    [
        (events.RunFinished, "the run finished"),
        (events.RunFailed, "the run failed"),
    ],
)
def test_save_and_stop_are_off_on_an_ended_run_with_the_reason(
    scenario: Scenario, end: type[events.Event], reason: str
) -> None:
    """On a finished or failed run a command would wait forever for an attempt: Save now and
    Stop are disabled and a line says why."""
    fields = {"reason": "completed"} if end is events.RunFinished else {"error": "OOM"}
    scenario.add(ev(events.RunStarted, 0), ev(end, 10, step=10, **fields))
    controls = _controls(scenario, T0 + 20)
    assert controls.save_button.disabled and controls.stop_button.disabled
    assert reason in controls.off_reason.object


def test_save_and_stop_are_off_on_a_stale_run_and_back_on_when_it_lives(
    scenario: Scenario,
) -> None:
    """A running attempt silent for 30 min is stale: the buttons are off with "no sign of
    life for 30 min — the command would wait for a next attempt"; a new heartbeat turns them
    back on and the line goes away."""
    scenario.add(ev(events.RunStarted, 0), ev(events.Heartbeat, 10, step=10))
    controls = _controls(scenario, T0 + 10 + 1800)
    assert controls.save_button.disabled and controls.stop_button.disabled
    assert (
        "no sign of life for 30 min — the command would wait for a next attempt"
        in controls.off_reason.object
    )
    scenario.add(ev(events.Heartbeat, 1805, step=20))
    controls.model.publish(scenario.folder(T0 + 1810))
    assert not controls.save_button.disabled and not controls.stop_button.disabled
    assert controls.off_reason.object == ""


def test_paths_read_relative_to_the_run_with_the_full_path_on_hover(scenario: Scenario) -> None:
    """The Commands answer names `checkpoints/…` (as does the header's resume line, built the
    same way); the full path is the element's title (hover)."""
    full = f"{scenario.root}/checkpoints/step=10-manual.ckpt"
    scenario.add(
        ev(events.RunStarted, 0),
        saved(5, full, 10, trigger="manual"),
        ev(events.CommandApplied, 6, command_id="c1", command="save_now", detail=full),
    )
    model = DashModel(path=scenario.root)
    model.publish(scenario.folder(T0 + 7))
    html = render_commands(model.run, 5)
    assert f'<code title="{full}">checkpoints/step=10-manual.ckpt</code>' in html


def test_the_checkpoint_tables_time_column_is_wide_enough_and_files_hover(
    scenario: Scenario,
) -> None:
    """The time column has a fixed width for a whole `2026-12-01 10:00:00` (fit-to-data sizes
    it from the first, often empty, frame); the file cell carries the full path as a title."""
    model = DashModel(path=scenario.root)
    model.publish(scenario.folder(T0))
    table = CheckpointTable(model, Controls(model, ControlActions(model))).table
    assert table.widths["time"] >= 19 * 8  # 19 characters of 13 px system-ui digits, at least
    assert 'title="<%- path %>"' in table.formatters["file"].template


def test_a_commands_marker_does_not_hide_the_save_it_caused(scenario: Scenario) -> None:
    """Save now's marker lands where its manual save lands: it is drawn below the save (an
    earlier renderer) and hollow, so the save's dot stays visible."""
    timeline = Timeline(DashModel(path=scenario.root))
    sources = timeline.sources
    order = [r.data_source for r in timeline.figure.renderers]
    commands = timeline.figure.renderers[order.index(sources["commands"])]
    assert order.index(sources["commands"]) < order.index(sources["checkpoints"])
    assert commands.glyph.fill_alpha == 0


def test_a_click_that_is_answered_at_once_is_shown_answered(
    live: Dashboard, wait_until: WaitUntil
) -> None:
    """A fast job may answer before the click's line is drawn: a later snapshot still
    replaces "waiting" by the answer (the line follows the last command, not one update)."""
    root = live.path
    _click(live, live.controls.save_button)
    _answer(root, events.CommandApplied, detail=str(root / "checkpoints" / "x.ckpt"))
    with EventWriter(root, attempt=0, host="n0") as w:
        w.emit(events.Heartbeat, step=7, t=time.time())
    wait_until(lambda: "applied" in live.controls.message.object, timeout=10, what="the answer")


def test_a_notebook_delivery_keeps_the_newest_value_until_the_widgets_comms_open() -> None:
    """In a notebook Panel drops a change it cannot send yet (the widget's comm not open,
    as under Run All until the front end's comm_open is handled), and never sends it again:
    so values wait, the newest kept, and the first one after the comm opens is applied."""
    from ckptdash.dash.delivery import Delivery

    applied: list[int] = []
    is_open = [False]
    delivery: Delivery[int] = Delivery(applied.append, None, gate=lambda: is_open[0])
    delivery(1)
    delivery(2)
    assert applied == []
    is_open[0] = True
    delivery(3)
    assert applied == [3]


def test_comm_opening_off_the_main_thread_needs_a_kernel_with_a_shell_channel_thread() -> None:
    """Outside ipykernel ≥ 7 (no shell-channel thread, no subshells) nothing is changed and
    the caller is told so: comm_open stays with the kernel's main thread."""
    from ckptdash.dash.notebook.kernelcomms import open_off_main_thread

    class OldKernel:
        comm_manager = object()
        _supports_kernel_subshells = False

    assert open_off_main_thread(OldKernel(), ["target-1"]) is False
