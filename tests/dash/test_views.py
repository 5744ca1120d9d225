"""The views and controls, without a server: what they show, what a click writes, and that
updates arrive from the follower's thread while the main thread is blocked."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ckptdash import control, events
from ckptdash.dash.app import Dashboard, DashOptions, dashboard
from ckptdash.dash.feed.hub import FollowerHub
from ckptdash.dash.model import DashModel
from ckptdash.dash.views import render_commands
from ckptdash.dash.views.controls import ControlActions
from ckptdash.dash.views.timeline import TRIGGER_COLORS, timeline_data
from ckptdash.dash.views.widgets import button_label
from ckptdash.errors import ControlError
from ckptdash.resume import choose_resume
from ckptdash.rundir.writer import EventWriter
from tests.dash.conftest import T0, Scenario, ev, preempted_run, saved

WaitUntil = Callable[..., None]


@pytest.fixture
def dash(
    make_run: Callable[..., Path], hub: FollowerHub, wait_until: WaitUntil
) -> Iterator[Dashboard]:
    """A dashboard (no server) on the preempted run, loaded; the run declared its /ck folder."""
    root = make_run(evs=[*preempted_run(), ev(events.CheckpointDirDeclared, 0.5, path="/ck")])
    d = Dashboard(root, options=DashOptions(watch="inotify"), hub=hub)
    wait_until(lambda: len(d.table.table.value) > 0, what="the first load")
    with d.holding_updates():
        pass  # the first snapshot has reached every view
    yield d
    d.close()


def _clicks(dash: Dashboard, button: Any) -> None:
    with dash.holding_updates():  # a click lands between snapshots, as in the browser
        button.clicks += 1  # what a browser click does to a Panel button


def _inbox(root: Path) -> list[Path]:
    return sorted((root / "control" / "inbox").glob("*.json"))


def test_header_shows_state_job_attempt_progress_and_resume(dash: Dashboard) -> None:
    """The header names the state, scheduler and job, attempt of budget, host, step of max,
    requeue policy and the resume choice with its reason."""
    html = dash.header._pane.object
    # The events are from 2025: the attempt that never said it ended is shown as stale.
    for text in ("stale", "slurm 77", "n2", "450", "1,000", "auto-requeue", "next attempt"):
        assert text in html, text
    assert "17 events" in html


def test_table_lists_checkpoints_newest_first(dash: Dashboard) -> None:
    """One row per checkpoint, newest step first, with trigger and status."""
    df = dash.table.table.value
    assert list(df["step"]) == [350, 250, 200, 100]
    assert list(df["trigger"]) == ["periodic", "signal", "periodic", "periodic"]
    assert set(df["status"]) == {"saved"}


def test_save_now_writes_one_command_and_changes_nothing_shown(dash: Dashboard) -> None:
    """A click writes exactly one command file; the shown state is untouched until the follower
    reads the file back (then the command shows as pending)."""
    root = dash.path
    dash.follower.stop()  # nothing reads the file back during this test
    run_before = dash.model.run
    _clicks(dash, dash.controls.save_button)
    files = _inbox(root)
    assert len(files) == 1
    assert control.claim(root)[0].command_name == "save_now"
    assert dash.model.run is run_before
    assert "Save now sent" in dash.controls.message.object


def test_pending_then_applied_comes_back_through_the_log(
    dash: Dashboard, wait_until: WaitUntil
) -> None:
    """The command list shows the click as pending, then the job's answer with the path."""
    root = dash.path
    _clicks(dash, dash.controls.save_button)
    wait_until(lambda: "pending" in dash.commands._pane.object, timeout=5, what="pending")
    (claimed,) = control.claim(root)
    with EventWriter(root, attempt=2) as w:
        w.emit(events.CommandReceived, step=451, command_id=claimed.id, command="save_now")
        w.emit(
            events.CommandApplied,
            step=451,
            command_id=claimed.id,
            command="save_now",
            detail="/ck/manual-451.ckpt",
        )
    control.complete(root, claimed)
    wait_until(lambda: "applied" in dash.commands._pane.object, timeout=5, what="applied")
    assert "/ck/manual-451.ckpt" in dash.commands._pane.object


def test_stop_asks_for_confirmation_first(dash: Dashboard) -> None:
    """Stop after save writes nothing until confirmed; Cancel writes nothing; Confirm writes
    one stop command."""
    root = dash.path
    _clicks(dash, dash.controls.stop_button)
    assert dash.controls.confirm_row.visible
    assert _inbox(root) == []
    _clicks(dash, dash.controls.cancel_button)
    assert not dash.controls.confirm_row.visible
    assert _inbox(root) == []
    _clicks(dash, dash.controls.stop_button)
    _clicks(dash, dash.controls.confirm_button)
    (claimed,) = control.claim(root)
    assert claimed.command_name == "stop_after_save"


def test_requeue_button_flips_the_setting(dash: Dashboard, wait_until: WaitUntil) -> None:
    """The button asks for the opposite of what is shown, and relabels once the file is read."""
    root = dash.path
    _clicks(dash, dash.controls.requeue_button)
    assert control.read_settings(root).requeue_suspended
    wait_until(
        lambda: button_label(dash.controls.requeue_button) == "Allow auto-requeue", timeout=5
    )
    assert "suspended" in dash.header._pane.object
    _clicks(dash, dash.controls.requeue_button)
    assert not control.read_settings(root).requeue_suspended


def test_pin_only_a_recorded_valid_checkpoint(
    make_run: Callable[..., Path], hub: FollowerHub, wait_until: WaitUntil, tmp_path: Path
) -> None:
    """Pinning a selected row writes the pin and changes the resume choice; a path the run
    never recorded is refused and nothing is written."""
    ckpt = tmp_path / "ck"
    ckpt.mkdir()
    for name in ("a", "b"):
        (ckpt / f"{name}.ckpt").write_bytes(b"x" * 100)
    root = make_run(
        evs=[
            ev(events.RunStarted, 0),
            ev(events.CheckpointDirDeclared, 1, path=str(ckpt)),
            saved(10, str(ckpt / "a.ckpt"), 10),
            saved(20, str(ckpt / "b.ckpt"), 20),
        ]
    )
    d = Dashboard(root, options=DashOptions(watch="inotify"), hub=hub)
    try:
        wait_until(lambda: d.model.run is not None and len(d.table.table.value) == 2)
        assert choose_resume(root).path == str(ckpt / "b.ckpt")
        with d.holding_updates():  # as a notebook user's click: not while a snapshot lands
            d.table.table.selection = [1]  # the older checkpoint, a.ckpt
        assert not d.table.pin_button.disabled
        _clicks(d, d.table.pin_button)
        assert control.read_settings(root).resume_pin == str(ckpt / "a.ckpt")
        assert choose_resume(root).path == str(ckpt / "a.ckpt")
        wait_until(lambda: "pinned" in d.table.table.value["resume"].iloc[1], timeout=5)
        assert not d.controls.clear_pin_button.disabled
        with pytest.raises(ControlError, match="not a valid checkpoint"):
            d.actions.pin("/etc/passwd")
        assert control.read_settings(root).resume_pin == str(ckpt / "a.ckpt")
        _clicks(d, d.controls.clear_pin_button)
        assert control.read_settings(root).resume_pin is None
    finally:
        d.close()


def test_selection_follows_the_checkpoint_when_rows_move(
    dash: Dashboard, wait_until: WaitUntil
) -> None:
    """A new checkpoint moves the rows down; the selection stays on the same checkpoint."""
    root = dash.path
    with dash.holding_updates():
        dash.table.table.selection = [1]  # step 250, the signal save
    with EventWriter(root, attempt=2) as w:
        w.write(saved(700, "/ck/new.ckpt", 500, attempt=2))
    wait_until(lambda: dash.table.table.selection == [2], timeout=5, what="the moved selection")
    assert len(dash.table.table.value) == 5
    assert dash.table._selected_path == "/ck/sig.ckpt"


def test_the_notebook_widget_is_returned_with_its_first_read_done(
    make_run: Callable[..., Path],
) -> None:
    """ckptdash.dashboard() returns a widget that already shows the run: in a notebook, a
    change made before the front end opened the widget's comm never reaches the page."""
    d = dashboard(make_run())
    try:
        assert d.model.loaded and d.model.run is not None
        assert "reading" not in d.header._pane.object
    finally:
        d.close()


def test_actions_refuse_without_a_run(tmp_path: Path) -> None:
    """With no run yet, an action says it waits for the run to start, and writes nothing."""
    actions = ControlActions(DashModel(path=str(tmp_path)))
    with pytest.raises(ControlError, match="waiting for the run to start"):
        actions.save_now()


def test_updates_arrive_while_the_main_thread_blocks(
    dash: Dashboard, wait_until: WaitUntil
) -> None:
    """Views are updated from the follower's thread, with no event loop: what keeps a notebook
    widget live while a cell runs trainer.fit(). The main thread only waits on an Event."""
    root = dash.path
    seen = threading.Event()
    updated_in: list[str] = []

    def on_value(event: Any) -> None:
        if len(event.new) == 5:
            updated_in.append(threading.current_thread().name)
            seen.set()

    dash.table.table.param.watch(on_value, "value")
    with EventWriter(root, attempt=2) as w:
        w.write(saved(700, "/ck/new.ckpt", 500, attempt=2))
    assert seen.wait(5), "the table was not updated while the main thread blocked"
    assert updated_in == [f"ckptdash-watch:{root.name}"]


def test_folder_lists_runs_and_selection_switches_the_views(
    make_run: Callable[..., Path], hub: FollowerHub, wait_until: WaitUntil, tmp_path: Path
) -> None:
    """A folder of runs shows the run list; selecting a row shows that run."""
    make_run("a")
    make_run("b", evs=[ev(events.RunStarted, 0, scheduler="local"), saved(5, "/ck/x", 5)])
    d = Dashboard(tmp_path, options=DashOptions(watch="inotify"), hub=hub)
    try:
        wait_until(lambda: len(d.model.runs) == 2, what="both runs")
        assert d.runs._layout.visible
        wait_until(lambda: list(d.runs._table.value["run"]) == ["a", "b"], what="the run table")
        with d.holding_updates():
            d.runs._table.selection = [1]
        assert d.model.selected == str(tmp_path / "b")
        # An idle run of a folder rests as its summary line; selecting it opens it again.
        wait_until(lambda: list(d.table.table.value["step"]) == [5], what="b's checkpoints")
    finally:
        d.close()


def test_timeline_draws_attempts_saves_markers_and_margins(scenario: Scenario) -> None:
    """Bands per attempt, dots coloured by trigger, the signal, the requeue, and one margin bar
    from the signal to the requeue."""
    scenario.add(*preempted_run())
    d = timeline_data(scenario.snapshot())
    assert len(d["attempts"]["left"]) == 3
    assert d["checkpoints"]["color"].count(TRIGGER_COLORS["signal"]) == 1
    assert len(d["signals"]["x"]) == 1
    assert d["requeues"]["title"] == ["requeue issued"]
    assert d["margins"]["x0"] == [(T0 + 250) * 1000]
    assert d["margins"]["x1"] == [(T0 + 254) * 1000]
    assert all(len(d["progress"]["xs"][i]) >= 1 for i in range(3))


def test_text_from_files_is_escaped(scenario: Scenario) -> None:
    """Reasons and paths come from files anyone could write: they are shown, never run."""
    scenario.add(
        ev(events.RunStarted, 0),
        ev(events.CommandRejected, 1, command_id="x1", reason="<script>alert(1)</script>"),
    )
    html = render_commands(scenario.snapshot(), 5)
    assert "<script>" not in html
    assert "&lt;script&gt;" in html


def test_timeline_without_a_server_redraws_at_once_and_pushes(
    scenario: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shown in a notebook (a document without a server session), the plot is changed in the
    publishing thread and pushed over the comm at once: no event loop is needed. Redraws
    closer than REDRAW_GAP_S apart wait for the next clock tick."""
    from bokeh.document import Document
    from bokeh.models import HoverTool

    from ckptdash.dash.views import timeline as timeline_module

    pushed: list[object] = []
    monkeypatch.setattr(timeline_module.pn.io, "push_notebook", lambda *o: pushed.extend(o))
    model = DashModel(path="/runs/exp1")
    timeline = timeline_module.Timeline(model)
    assert any(isinstance(t, HoverTool) for t in timeline.figure.tools)
    doc = Document()  # what a notebook cell renders into: no server session
    doc.add_root(timeline.__panel__().get_root(doc))
    scenario.add(*preempted_run())
    model.publish(scenario.folder(T0 + 620))
    assert len(timeline.sources["checkpoints"].data["x"]) == 4
    assert pushed == [timeline.__panel__()]
    scenario.add(saved(630, "/ck/e.ckpt", 460, attempt=2))
    model.publish(scenario.folder(T0 + 631))  # within REDRAW_GAP_S: waits
    assert len(timeline.sources["checkpoints"].data["x"]) == 4
    monkeypatch.setattr(timeline, "_last_draw", -1e9)  # the gap has passed
    model.publish(scenario.folder(T0 + 632))  # the next tick draws it
    assert len(timeline.sources["checkpoints"].data["x"]) == 5


def test_first_rows_change_only_the_tables_data_not_their_configuration(
    make_run: Callable[..., Path], hub: FollowerHub, wait_until: WaitUntil, tmp_path: Path
) -> None:
    """A page opened on a run with no checkpoint yet must draw the first rows when they come.
    The browser rebuilds a table whose configuration changes, and rows that arrive during that
    rebuild are never drawn; so the first rows (and a column that was all empty, like an epoch
    the job never reported) may change the data sent to the page, never the configuration."""
    from bokeh.document import Document
    from bokeh.document.events import ModelChangedEvent

    young = [ev(events.RunStarted, 0, scheduler="local", max_steps=100)]
    make_run("a", evs=young)
    root = make_run("b", evs=young)
    d = Dashboard(tmp_path, options=DashOptions(watch="inotify"), hub=hub)
    try:
        wait_until(lambda: len(d.runs._table.value) == 2, what="both runs listed")
        doc = Document()
        models = {
            "checkpoints": d.table.table.get_root(doc),
            "runs": d.runs._table.get_root(doc),
        }
        for model in models.values():
            doc.add_root(model)
        sent_first = {name: model.configuration for name, model in models.items()}
        changed: list[str] = []

        def record(event: Any) -> None:
            if isinstance(event, ModelChangedEvent) and event.attr in ("configuration", "columns"):
                changed.append(f"{event.model}.{event.attr}")

        doc.on_change(record)
        with d.holding_updates():
            d.runs._table.selection = [1]
        with EventWriter(root, attempt=0) as w:
            w.write(saved(10, "/ck/first.ckpt", 10))  # no epoch: the column stays empty
            w.write(ev(events.Heartbeat, 11, step=12))
        wait_until(lambda: len(d.table.table.value) == 1, what="the first row")
        with EventWriter(root, attempt=0) as w:
            w.write(saved(20, "/ck/second.ckpt", 20, epoch=1))
        wait_until(lambda: len(d.table.table.value) == 2, what="the second row")
        # Run a has no step yet, run b has one: a column of a number and a missing value.
        wait_until(lambda: bool(d.runs._table.value["step"].notna().iloc[1]), what="b's step")
        with d.holding_updates():
            assert list(models["checkpoints"].source.data["step"]) == [20, 10]
        assert changed == []
        assert {name: m.configuration for name, m in models.items()} == sent_first
        # The sorters were right from the first, empty frame: numbers sort as numbers.
        sorters = {c["field"]: c.get("sorter") for c in sent_first["checkpoints"]["columns"]}
        assert sorters["step"] == sorters["epoch"] == sorters["size"] == "number"
        assert sorters["time"] == "timestamp"
    finally:
        d.close()


def test_a_locked_page_shows_why_and_its_actions_write_nothing(
    make_run: Callable[..., Path], hub: FollowerHub, wait_until: WaitUntil
) -> None:
    """``DashOptions(controls_off=...)`` (``panel serve`` without a login): every control is
    off and the page says why; the actions refuse on their own too, since a client can send
    a click for a disabled button, and nothing is written."""
    root = make_run(evs=[*preempted_run(), ev(events.CheckpointDirDeclared, 0.5, path="/ck")])
    d = Dashboard(root, options=DashOptions(watch="inotify", controls_off="no login"), hub=hub)
    try:
        wait_until(lambda: len(d.table.table.value) > 0, what="the first load")
        with d.holding_updates():
            d.table.table.selection = [1]
        c = d.controls
        for b in (c.save_button, c.stop_button, c.requeue_button, c.clear_pin_button):
            assert b.disabled
        assert d.table.pin_button.disabled
        assert "Controls are off: no login" in c.off_reason.object
        saved = sorted(d.model.run.valid_paths())[0]
        for act in (
            d.actions.save_now,
            d.actions.stop_after_save,
            lambda: d.actions.set_requeue_suspended(True),
            lambda: d.actions.pin(saved),
            d.actions.clear_pin,
        ):
            with pytest.raises(ControlError, match="controls are off on this page: no login"):
                act()
        _clicks(d, c.save_button)  # a forged click reaches the handler: refused, said
        assert "controls are off" in c.message.object
        assert _inbox(root) == []
        settings = control.read_settings(root)
        assert not settings.requeue_suspended and settings.resume_pin is None
    finally:
        d.close()


def test_header_names_the_logger_runs_of_the_run(
    make_run: Callable[..., Path], hub: FollowerHub, wait_until: WaitUntil
) -> None:
    """A run whose attempts logged into a TensorBoard folder and a W&B run says so in the
    header, one line each: which logger, which id, where, and what the last attempt redid."""
    tb = ev(events.LoggerAttached, 0.6, logger="tensorboard", id="ckptdash-r1", location="/tb/x")
    wb = ev(events.LoggerAttached, 0.7, logger="wandb", id="ckptdash-r1", redone="dropped")
    root = make_run(evs=[*preempted_run(), tb, wb])
    d = Dashboard(root, options=DashOptions(watch="inotify"), hub=hub)
    try:
        wait_until(lambda: "curves:" in d.header._pane.object, what="the logger lines")
        html = d.header._pane.object
        assert "curves: tensorboard ckptdash-r1 in /tb/x" in html
        assert "curves: wandb ckptdash-r1" in html and "later steps dropped" in html
    finally:
        d.close()


def test_timeline_labels_its_bands_and_lists_only_the_kinds_it_draws(
    scenario: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each attempt's band is labelled with its number and outcome, on the plot; the legend
    lists only what the plot draws (a run with no command or exception lists neither), and an
    entry appears when its first glyph does. Before any run, the legend lists nothing."""
    from bokeh.document import Document
    from bokeh.models import GlyphRenderer, Text

    from ckptdash.dash.views import timeline as timeline_module

    monkeypatch.setattr(timeline_module.pn.io, "push_notebook", lambda *o: None)
    model = DashModel(path="/runs/exp1")
    timeline = timeline_module.Timeline(model)
    Document().add_root(timeline.__panel__().get_root(Document()))
    legend = timeline.figure.legend[0]

    def listed() -> set[str]:
        return {
            str(getattr(item.label, "value", None) or item.label.field)
            for item in legend.items
            if item.visible
        }

    assert listed() <= {"label"}  # the saves' entry: one per trigger in the data, none yet
    scenario.add(*preempted_run())
    model.publish(scenario.folder(T0 + 620))
    assert listed() == {"attempt", "preemption margin", "signal received", "requeue", "label"}
    [labels] = [
        r
        for r in timeline.figure.renderers
        if isinstance(r, GlyphRenderer) and isinstance(r.glyph, Text)
    ]
    assert labels.data_source is timeline.sources["attempts"]
    assert labels.glyph.text == "label" or labels.glyph.text.field == "label"
    assert timeline.sources["attempts"].data["label"] == [
        "attempt 0 · preempted",
        "attempt 1 · lost",
        "attempt 2 · running",
    ]

    scenario.add(
        ev(events.ExceptionRaised, 630, attempt=2, step=460, error_type="OOM", message="oom")
    )
    monkeypatch.setattr(timeline, "_last_draw", -1e9)  # the redraw gap has passed
    model.publish(scenario.folder(T0 + 632))
    assert "exception" in listed() and "command" not in listed()
