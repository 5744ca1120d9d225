"""The checkpoint table: one row per checkpoint path, newest first; pin a row to resume from it."""

from __future__ import annotations

import time
from typing import Any, Final

import pandas as pd
import panel as pn
from bokeh.models.widgets.tables import DateFormatter, HTMLTemplateFormatter, NumberFormatter

from ckptdash.dash.feed.snapshot import RunSnapshot
from ckptdash.dash.model import DashModel
from ckptdash.dash.views.controls import Controls
from ckptdash.dash.views.frames import NUMBER, TEXT, TIME, typed_frame
from ckptdash.dash.views.metrics import metrics_at_save
from ckptdash.dash.views.text import relative
from ckptdash.dash.views.widgets import HtmlPane, ReadOnlyTabulator, button
from ckptdash.state.checkpoints import kind as checkpoint_kind

SCHEMA: Final = {
    "step": NUMBER,
    "epoch": NUMBER,
    "trigger": TEXT,
    "time": TIME,
    "size": NUMBER,
    "save s": NUMBER,
    "stall s": NUMBER,
    "kind": TEXT,
    "status": TEXT,
    "resume": TEXT,
    "attempt": NUMBER,
    "file": TEXT,
    "metrics": TEXT,
    "path": TEXT,
}


FILE_TEMPLATE: Final = '<span title="<%- path %>"><%- value %></span>'
COLUMN_WIDTHS: Final = {
    "time": 165,
    "size": 90,
    "save s": 75,
    "trigger": 90,
    "kind": 90,
    "resume": 95,
}


def checkpoint_frame(snap: RunSnapshot | None) -> pd.DataFrame:
    """The table's rows: numbers stay numbers so that sorting works; ``resume`` marks the
    pinned checkpoint and the one the next attempt will load."""
    if snap is None:
        return typed_frame([], SCHEMA)
    pin = snap.settings.resume_pin if snap.settings is not None else None
    chosen = snap.resume.path if snap.resume is not None else None
    fresh = [a.attempt for a in snap.attempts if a.fresh]
    since = max(fresh) if fresh else -1  # the fresh-start boundary: older saves are history
    rows = []
    by_path = {c.path: c for c in snap.checkpoints}
    for c in snap.checkpoints:
        marks = []
        if c.status == "saved" and c.attempt is not None and c.attempt < since:
            marks.append("before fresh start")
        if c.path == chosen:
            marks.append("next")
        if pin and c.path == pin:
            sticky = snap.settings is not None and snap.settings.resume_pin_sticky
            marks.append("pinned (sticky)" if sticky else "pinned")
        status = c.status + (f": {c.reason}" if c.reason else "")
        if c.replaced:  # a path saved over and over (last.ckpt): one row, every save counted
            status += f" (saved x{c.replaced + 1})"
        status += f" ({c.error})" if c.error else ""
        status += f" (unvalidated: {c.unvalidated})" if c.unvalidated else ""
        rows.append(
            {
                "step": c.step,
                "epoch": c.epoch,
                "trigger": c.trigger,
                "kind": checkpoint_kind(c, by_path),  # resumes / artifact / = its target
                "time": _local(c.t),
                "size": None if c.unvalidated else c.size_bytes,  # nothing ckptdash could see
                "save s": c.duration_s,
                "stall s": c.blocking_s,  # below "save s" when it persisted in the background
                "status": status,
                "resume": " ".join(marks),
                "attempt": c.attempt,
                "file": relative(c.path, snap.root),
                "metrics": metrics_at_save(snap, c),  # the heartbeat nearest the save's step
                "path": c.path,
            }
        )
    return typed_frame(rows, SCHEMA)


def _local(t: float | None) -> Any:
    """A naive timestamp in this host's local time (Tabulator shows naive datetimes as they are)."""
    if t is None:
        return pd.NaT
    return pd.Timestamp(t + time.localtime(t).tm_gmtoff, unit="s")


class CheckpointTable(pn.viewable.Viewer):  # type: ignore[misc]
    """Sortable checkpoint table; select a row and click "Resume from this" to pin it."""

    def __init__(self, model: DashModel, controls: Controls, **params: Any) -> None:
        super().__init__(**params)
        self.model = model
        self.controls = controls
        self.table = ReadOnlyTabulator(
            checkpoint_frame(None),
            show_index=False,
            selectable=1,
            disabled=True,
            height=300,
            sizing_mode="stretch_width",
            layout="fit_data_stretch",
            hidden_columns=["path"],  # kept for the pin; "file" is what a person reads
            # Every typed column gets its formatter here: Panel derives the defaults from the
            # dtypes of the frame the page first rendered and never revisits them.
            formatters={
                "step": NumberFormatter(format="0,0", nan_format="–"),
                "epoch": NumberFormatter(format="0", nan_format="–"),
                "time": DateFormatter(format="%Y-%m-%d %H:%M:%S", nan_format="–"),
                "size": NumberFormatter(format="0.0 b", nan_format="–"),
                "save s": NumberFormatter(format="0.00", nan_format="–"),
                "stall s": NumberFormatter(format="0.000", nan_format="–"),
                "attempt": NumberFormatter(format="0", nan_format="–"),
                # Relative to the run directory; the full path on hover (`<%- %>` escapes).
                "file": HTMLTemplateFormatter(template=FILE_TEMPLATE),
            },
            text_align={"step": "right", "epoch": "right", "attempt": "right"},
            # fit_data sizes columns to the first frame the page rendered, often empty: a
            # date would then be cut to "2026-12-0". Fixed widths for what has a known size.
            widths=COLUMN_WIDTHS,
        )
        self.pin_button = button("Resume from this", "primary", disabled=True)
        self.pin_button.on_click(self._pin)
        self.table.param.watch(self._on_select, "selection")
        self._shown: tuple[object, ...] = ()
        self._selected_path: str | None = None
        self._layout = pn.Column(
            pn.Row(
                HtmlPane("<div class='ck'><h4>Checkpoints</h4></div>"),
                self.pin_button,
            ),
            self.table,
            sizing_mode="stretch_width",
        )
        model.param.watch(self._render, ["run"])
        self._render()

    def __panel__(self) -> Any:
        return self._layout

    def _render(self, *events: object) -> None:
        snap = self.model.run
        key = (
            None if snap is None else snap.root,
            None if snap is None else snap.checkpoints,
            None if snap is None else snap.settings,
            None if snap is None else snap.resume,
        )
        if len(self._shown) == len(key) and all(
            a is b for a, b in zip(key, self._shown, strict=True)
        ):
            return  # a heartbeat: the rows are the same objects as last time
        self._shown = key
        df = checkpoint_frame(snap)
        paths = list(df["path"])
        keep = self._selected_path
        # Rows move when a checkpoint arrives: keep the same checkpoint selected, not the same row.
        self.table.param.update(value=df, selection=[paths.index(keep)] if keep in paths else [])
        self._update_button()

    def _on_select(self, event: Any) -> None:
        df = self.table.value
        rows = [i for i in event.new if 0 <= i < len(df)]
        self._selected_path = str(df["path"].iloc[rows[0]]) if rows else None
        self._update_button()

    def _update_button(self) -> None:
        snap = self.model.run
        valid = snap is not None and self._selected_path in snap.valid_paths()
        self.pin_button.disabled = not valid or bool(self.controls.actions.locked)

    def _pin(self, _: object) -> None:
        path = self._selected_path
        if path is None:
            self.controls.say("select a checkpoint row first", problem=True)
            return
        self.controls.run_action(lambda: self.controls.actions.pin(path))
