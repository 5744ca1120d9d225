"""The run list of a folder: one row per run; selecting a row shows that run."""

from __future__ import annotations

import contextlib
from typing import Any, Final

import pandas as pd
import panel as pn
from bokeh.models.widgets.tables import NumberFormatter

from ckptdash import humanize
from ckptdash.analysis import goodput
from ckptdash.dash.feed.snapshot import RunSnapshot
from ckptdash.dash.model import DashModel, run_status
from ckptdash.dash.views.frames import NUMBER, TEXT, typed_frame
from ckptdash.dash.views.widgets import HtmlPane, ReadOnlyTabulator


class RunList(pn.viewable.Viewer):  # type: ignore[misc]
    """The runs of a folder: status, attempt, step, last event; selecting one shows it."""

    SCHEMA: Final = {
        "run": TEXT,
        "status": TEXT,
        "attempt": NUMBER,
        "step": NUMBER,
        "last event": TEXT,
        "events": NUMBER,
        "goodput": NUMBER,
    }

    def __init__(self, model: DashModel, **params: Any) -> None:
        super().__init__(**params)
        self.model = model
        self._roots: list[str] = []
        self._table = ReadOnlyTabulator(
            typed_frame([], self.SCHEMA),
            show_index=False,
            selectable=1,
            disabled=True,
            height=180,
            sizing_mode="stretch_width",
            layout="fit_data_stretch",
            # Explicit: the defaults would come from the empty first frame (see table.py).
            formatters={
                "attempt": NumberFormatter(format="0", nan_format="–"),
                "step": NumberFormatter(format="0,0", nan_format="–"),
                "events": NumberFormatter(format="0,0", nan_format="–"),
                "goodput": NumberFormatter(format="0.0%", nan_format="–"),
            },
            text_align={"attempt": "right", "step": "right", "events": "right", "goodput": "right"},
        )
        self._heading = HtmlPane(margin=(0, 10))
        self._layout = pn.Column(
            self._heading,
            self._table,
            visible=False,
            sizing_mode="stretch_width",
        )
        self._table.param.watch(self._on_select, "selection")
        model.param.watch(self._render, ["runs", "now", "is_folder", "selected"])
        self._render()

    def __panel__(self) -> Any:
        return self._layout

    def frame(self) -> pd.DataFrame:
        """The table's rows for the model's runs now."""
        now, stale = self.model.now, self.model.stale_after_s
        rows = []
        for r in self.model.runs:
            newest = r.newest
            rows.append(
                {
                    "run": r.name,
                    "status": run_status(r, now, stale)[0],
                    "attempt": None if newest is None else newest.attempt,
                    "step": None if newest is None else newest.step,
                    "last event": humanize.age(r.last_seen, now),
                    "events": r.events_total,
                    "goodput": _goodput_of(r, now),
                }
            )
        return typed_frame(rows, self.SCHEMA)

    def _render(self, *events: object) -> None:
        self._layout.visible = self.model.is_folder
        if not self.model.is_folder:
            return
        df = self.frame()
        self._heading.object = f"<div class='ck'><h4>Runs ({len(df)})</h4></div>"
        roots = [r.root for r in self.model.runs]
        if roots != self._roots or not df.equals(self._table.value):
            self._roots = roots
            self._table.value = df
        if self.model.selected in roots:
            wanted = [roots.index(self.model.selected)]
            if self._table.selection != wanted:
                self._table.selection = wanted

    def _on_select(self, event: Any) -> None:
        # Browser input: map the row to a run we listed; anything else is ignored.
        if len(event.new) == 1 and 0 <= event.new[0] < len(self._roots):
            with contextlib.suppress(ValueError):
                self.model.select(self._roots[event.new[0]])


def _goodput_of(snap: RunSnapshot, now: float) -> float | None:
    # The same numbers as `ckptdash goodput`.
    return goodput.compute(snap.attempts, snap.times, now).goodput
