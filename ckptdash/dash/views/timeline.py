"""The timeline: one Bokeh figure, wall time on x and training step on y.

Attempts are bands, each labelled with its number and outcome; each attempt's
progress is a line; checkpoint saves are dots coloured by trigger; signals,
requeues, commands and exceptions are markers at the step they happened; each
preemption's margin (signal → save durable → requeue) is a thick bar. Every
glyph has a hover tooltip. The legend lists only the kinds the run has: a run
never signalled shows no "signal received".

The figure is changed in place (the zoom survives an update): on a served
page through the session's event loop, in a notebook directly followed by a
push over the comm — an event-loop callback would wait until the running
cell ends.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import panel as pn
from bokeh.models import ColumnDataSource, DatetimeTickFormatter, HoverTool
from bokeh.plotting import figure

from ckptdash import humanize
from ckptdash.analysis import preemption
from ckptdash.dash import theme
from ckptdash.dash.feed.snapshot import RunSnapshot
from ckptdash.dash.model import DashModel
from ckptdash.dash.views.text import esc
from ckptdash.dash.views.widgets import HOVER_TOOLTIP

TRIGGER_COLORS: Final = {
    "periodic": "#4c78a8",
    "manual": "#f58518",
    "signal": "#e45756",
    "exception": "#b279a2",
    "api": "#54a24b",
    "final": "#9d755d",
}
OUTCOME_COLORS: Final = {
    "running": "#d3f9d8",
    "finished": "#d3f9d8",
    "stopped": "#e7f5ff",
    "lost": "#ffe3e3",
    "failed": "#ffe3e3",
}
COMMAND_COLORS: Final = {"applied": "#2b8a3e", "rejected": "#c92a2a", "expired": "#e8590c"}

Columns = dict[str, list[Any]]
Data = dict[str, Columns]

REDRAW_GAP_S: Final = 0.5
"""Redraw the plot at most this often. A redraw costs the browser tens of milliseconds and
heartbeats can come several times a second; the checkpoint table must not wait behind them."""


def _ms(t: float, offset_s: float) -> float:
    return (t + offset_s) * 1000.0


def _lines(*parts: str) -> str:
    return "<br>".join(esc(p) for p in parts if p)


def _step_at(snap: RunSnapshot, attempt: int | None, t: float) -> int:
    """The attempt's step at time ``t``, read off its progress points (for markers whose
    event carries no step)."""
    points = snap.series.get(attempt, ()) if attempt is not None else ()
    if not points:
        a = next((a for a in snap.attempts if a.attempt == attempt), None)
        return (a.step or 0) if a is not None else 0
    i = bisect.bisect_right(points, (t, math.inf))
    return points[max(0, i - 1)][1]


_COLUMNS: Final = {
    "attempts": ["left", "right", "top", "color", "label", "title", "desc"],
    "progress": ["xs", "ys", "title", "desc"],
    "checkpoints": ["x", "y", "label", "color", "title", "desc"],
    "signals": ["x", "y", "title", "desc"],
    "requeues": ["x", "y", "color", "title", "desc"],
    "commands": ["x", "y", "color", "title", "desc"],
    "exceptions": ["x", "y", "title", "desc"],
    "margins": ["x0", "x1", "y", "title", "desc"],
}
"""Each glyph's data source and its columns (``title`` and ``desc`` feed the hover tooltip)."""


def timeline_data(snap: RunSnapshot | None, offset_s: float = 0.0) -> Data:
    """The columns of every glyph for ``snap``; x is milliseconds (Bokeh datetime) + offset."""
    d: Data = {name: {c: [] for c in cols} for name, cols in _COLUMNS.items()}
    if snap is None:
        return d
    _attempt_bands(d["attempts"], snap, offset_s)
    _progress_lines(d["progress"], snap, offset_s)
    _checkpoint_dots(d["checkpoints"], snap, offset_s)
    _signal_markers(d["signals"], snap, offset_s)
    _requeue_markers(d["requeues"], snap, offset_s)
    _command_markers(d["commands"], snap, offset_s)
    _exception_markers(d["exceptions"], snap, offset_s)
    _margin_bars(d["margins"], snap, offset_s)
    return d


def _attempt_bands(band: Columns, snap: RunSnapshot, offset_s: float) -> None:
    """One band per attempt, from its start to its end (or its last heartbeat), full height."""
    steps = [a.step or 0 for a in snap.attempts] + [c.step or 0 for c in snap.checkpoints]
    top = max([1, *steps]) * 1.05
    for a in snap.attempts:
        start = a.started_at
        end = a.ended_at if a.ended_at is not None else a.last_heartbeat_t
        if start is None or end is None:
            continue
        band["left"].append(_ms(start, offset_s))
        band["right"].append(_ms(max(end, start + 1e-3), offset_s))
        band["top"].append(top)
        band["color"].append(OUTCOME_COLORS.get(a.outcome, "#f1f3f5"))
        # "stopped" says less than why: the reason (preempted, terminated) is the word to show.
        word = a.end_reason if a.outcome == "stopped" and a.end_reason else a.outcome
        band["label"].append(f"attempt {a.attempt} · {word}")
        band["title"].append(f"attempt {a.attempt}: {a.outcome}")
        band["desc"].append(
            _lines(
                f"{a.scheduler} job {a.job_id or '-'} on {a.host or '?'}",
                f"{humanize.clock(start)} → {humanize.clock(a.ended_at)}"
                f" ({humanize.duration(end - start)})",
                f"ended: {a.end_reason}" if a.end_reason else "",
                f"resumed from {a.resumed_from} ({a.resume_reason})" if a.resumed_from else "",
            )
        )


def _progress_lines(line: Columns, snap: RunSnapshot, offset_s: float) -> None:
    """Each attempt's step over time."""
    for n, points in snap.series.items():
        if points:
            line["xs"].append([_ms(t, offset_s) for t, _ in points])
            line["ys"].append([s for _, s in points])
            line["title"].append(f"attempt {n} progress")
            line["desc"].append(esc(f"steps {points[0][1]} → {points[-1][1]}"))


def _checkpoint_dots(ck: Columns, snap: RunSnapshot, offset_s: float) -> None:
    """Each checkpoint with a time, coloured by what triggered it."""
    for c in snap.checkpoints:
        if c.t is None:
            continue
        ck["x"].append(_ms(c.t, offset_s))
        ck["y"].append(c.step or 0)
        ck["label"].append(f"{c.trigger or '?'} save")
        ck["color"].append(TRIGGER_COLORS.get(c.trigger, "#868e96"))
        ck["title"].append(f"checkpoint step {c.step} ({c.trigger}, {c.status})")
        ck["desc"].append(
            _lines(
                c.path,
                f"{humanize.size(c.size_bytes)} saved in {humanize.duration(c.duration_s)}"
                f" at {humanize.clock(c.t)} by attempt {c.attempt}",
                c.reason or c.error,
            )
        )


def _signal_markers(sig: Columns, snap: RunSnapshot, offset_s: float) -> None:
    for s in snap.signals:
        sig["x"].append(_ms(s.t, offset_s))
        sig["y"].append(s.step if s.step is not None else _step_at(snap, s.attempt, s.t))
        sig["title"].append(f"signal {s.signal} → {s.action or '?'}")
        sig["desc"].append(_lines(f"attempt {s.attempt} rank {s.rank} at {humanize.clock(s.t)}"))


def _requeue_markers(rq: Columns, snap: RunSnapshot, offset_s: float) -> None:
    for r in snap.requeues:
        rq["x"].append(_ms(r.t, offset_s))
        rq["y"].append(_step_at(snap, r.attempt, r.t))
        rq["color"].append("#1971c2" if r.issued else "#c92a2a")
        rq["title"].append("requeue issued" if r.issued else "requeue skipped")
        rq["desc"].append(_lines(r.command if r.issued else r.reason, f"attempt {r.attempt}"))


def _command_markers(cm: Columns, snap: RunSnapshot, offset_s: float) -> None:
    """Each command at its latest moment (resolved, else received, else issued)."""
    for cmd in snap.commands:
        t = cmd.resolved_at or cmd.received_at or cmd.issued_at
        if t is None:
            continue
        cm["x"].append(_ms(t, offset_s))
        cm["y"].append(_step_at(snap, cmd.attempt, t))
        cm["color"].append(COMMAND_COLORS.get(cmd.status, "#1971c2"))
        cm["title"].append(f"{cmd.command or 'command'}: {cmd.status}")
        cm["desc"].append(_lines(f"by {cmd.author}", cmd.detail or cmd.reason or cmd.error))


def _exception_markers(ex: Columns, snap: RunSnapshot, offset_s: float) -> None:
    for e in snap.exceptions:
        ex["x"].append(_ms(e.t, offset_s))
        ex["y"].append(e.step if e.step is not None else _step_at(snap, e.attempt, e.t))
        ex["title"].append(f"exception {e.error_type}")
        ex["desc"].append(_lines(e.message, f"attempt {e.attempt} rank {e.rank}"))


def _margin_bars(mg: Columns, snap: RunSnapshot, offset_s: float) -> None:
    """Each preemption's margin: from the signal to the requeue (or the save, or the end)."""
    for p in preemption.preemptions(snap):
        if p.signal_t is None:
            continue
        end = p.requeue_t or p.saved_t or p.end_t
        mg["x0"].append(_ms(p.signal_t, offset_s))
        mg["x1"].append(_ms(max(end, p.signal_t), offset_s))
        mg["y"].append(_step_at(snap, p.attempt, p.signal_t))
        mg["title"].append(f"preemption of attempt {p.attempt}")
        mg["desc"].append(
            _lines(
                f"signal {p.signal} → save durable: {humanize.duration(p.signal_to_save_s)}",
                f"save → requeue: {humanize.duration(p.save_to_requeue_s)}",
                f"work lost: {humanize.duration(p.lost_s)}",
            )
        )


def _empty_figure(height: int) -> Any:
    """Datetime x, step y, horizontal pan and zoom (the steps axis stays whole)."""
    fig = figure(
        height=height,
        sizing_mode="stretch_width",
        x_axis_type="datetime",
        x_axis_label="wall time (dashboard host's local time)",
        y_axis_label="step",
        tools="xpan,xwheel_zoom,box_zoom,reset,save",
        active_scroll="xwheel_zoom",
        toolbar_location="right",
    )
    fig.xgrid.grid_line_alpha = 0.3
    fig.ygrid.grid_line_alpha = 0.3
    fig.xaxis.formatter = clock_ticks()
    return fig


def clock_ticks() -> DatetimeTickFormatter:
    """Wall-clock ticks at every zoom: Bokeh's defaults read "0ms", "500ms", "1s" on the few
    seconds after a run starts, which look like durations, not times."""
    clock = "%H:%M:%S"
    return DatetimeTickFormatter(
        milliseconds=f"{clock}.%3N",
        seconds=clock,
        minsec=clock,
        minutes="%H:%M",
        hourmin="%H:%M",
        hours="%H:%M",
    )


LEGEND_SOURCES: Final = {
    "attempt": "attempts",
    "preemption margin": "margins",
    "command": "commands",
    "signal received": "signals",
    "requeue": "requeues",
    "exception": "exceptions",
}
"""Each fixed legend entry and the source whose rows it stands for (checkpoint saves get one
entry per trigger from their data)."""


def _band_labels(fig: Any, s: dict[str, ColumnDataSource]) -> None:
    """Each band's name at its top left: which attempt, and how it ended."""
    fig.text(
        x="left",
        y="top",
        text="label",
        source=s["attempts"],
        text_baseline="top",
        text_font_size="11px",
        text_color=theme.TEXT_DARK if theme.is_dark() else "#495057",
        x_offset=4,
        y_offset=4,
    )


def _band_glyphs(fig: Any, s: dict[str, ColumnDataSource]) -> list[Any]:
    """The attempt bands, the progress lines and the preemption margins."""
    return [
        fig.quad(
            left="left",
            right="right",
            bottom=0,
            top="top",
            source=s["attempts"],
            fill_color="color",
            fill_alpha=0.55,
            line_color="#ced4da",
            legend_label="attempt",
        ),
        fig.multi_line(xs="xs", ys="ys", source=s["progress"], line_width=2, color="#495057"),
        fig.segment(
            x0="x0",
            x1="x1",
            y0="y",
            y1="y",
            source=s["margins"],
            line_width=8,
            line_alpha=0.6,
            color="#f08c00",
            legend_label="preemption margin",
        ),
    ]


def _marker_glyphs(fig: Any, s: dict[str, ColumnDataSource]) -> list[Any]:
    """Commands, checkpoints, signals, requeues and exceptions, at their moment and step."""
    return [
        # A command lands where its save lands (Save now → a manual save at the same step and
        # moment): drawn first and hollow, around the save's dot, so both stay visible.
        fig.scatter(
            "x",
            "y",
            source=s["commands"],
            marker="square",
            size=16,
            fill_alpha=0,
            line_width=2,
            line_color="color",
            legend_label="command",
        ),
        fig.scatter(
            "x",
            "y",
            source=s["checkpoints"],
            size=9,
            color="color",
            line_color="white",
            legend_field="label",
        ),
        fig.scatter(
            "x",
            "y",
            source=s["signals"],
            marker="inverted_triangle",
            size=13,
            color="#e03131",
            legend_label="signal received",
        ),
        fig.scatter(
            "x",
            "y",
            source=s["requeues"],
            marker="diamond",
            size=13,
            color="color",
            legend_label="requeue",
        ),
        fig.scatter(
            "x",
            "y",
            source=s["exceptions"],
            marker="x",
            size=13,
            line_width=3,
            color="#862e9c",
            legend_label="exception",
        ),
    ]


def _legend_outside(fig: Any) -> None:
    """Click an entry to hide its glyphs; the legend sits right of the plot: it hides nothing."""
    legend = fig.legend[0]
    legend.click_policy = "hide"
    legend.label_text_font_size = "11px"
    legend.border_line_alpha = 0
    fig.add_layout(legend, "right")


def _legend_present(fig: Any, data: Data) -> None:
    """Show a fixed legend entry only while its source has a row (set only when it changes)."""
    for item in fig.legend[0].items:
        name = LEGEND_SOURCES.get(str(getattr(item.label, "value", "")))  # not a field's label
        if name is None:
            continue
        present = bool(next(iter(data[name].values())))
        if item.visible != present:
            item.visible = present


class Timeline(pn.viewable.Viewer):  # type: ignore[misc]
    """The run's timeline; redrawn in place whenever the selected run changes."""

    def __init__(self, model: DashModel, height: int = 320, **params: Any) -> None:
        super().__init__(**params)
        self.model = model
        # Bokeh draws datetimes in UTC: shift by this host's offset so the axis reads local time.
        self._offset_s = float(time.localtime().tm_gmtoff)
        self.sources = {name: ColumnDataSource(cols) for name, cols in timeline_data(None).items()}
        self.figure = self._figure(height)
        self._pane = pn.pane.Bokeh(self.figure, sizing_mode="stretch_width")
        self._lock = threading.Lock()
        self._pending: RunSnapshot | None = None
        self._has_pending = False
        self._scheduled = False
        self._last_draw = -math.inf
        self._shown: object = None
        self._sent: Data = {}  # what the browser has: only changed sources are sent again
        model.param.watch(self._on_run, ["run"])
        model.param.watch(self._draw_if_due, ["now"])
        self._on_run()

    def __panel__(self) -> Any:
        return self._pane

    def _figure(self, height: int) -> Any:
        fig = _empty_figure(height)
        # Drawn in this order: bands under lines under markers.
        hover = [*_band_glyphs(fig, self.sources), *_marker_glyphs(fig, self.sources)]
        _band_labels(fig, self.sources)
        fig.add_tools(HoverTool(renderers=hover, tooltips=HOVER_TOOLTIP))
        _legend_outside(fig)
        _legend_present(fig, timeline_data(None))
        theme.style_figure(fig, served=theme.served())
        return fig

    def _on_run(self, *events: object) -> None:
        snap = self.model.run
        if snap is self._shown:
            return
        self._shown = snap
        with self._lock:
            self._pending, self._has_pending = snap, True
        self._draw_if_due()

    def _draw_if_due(self, *events: object) -> None:
        """Draw the newest run unless a redraw is queued or was made less than REDRAW_GAP_S
        ago; then the next clock tick (at least once a second) draws it."""
        with self._lock:
            now = time.monotonic()
            if not self._has_pending or self._scheduled or now - self._last_draw < REDRAW_GAP_S:
                return
            snap, self._pending, self._has_pending = self._pending, None, False
            self._scheduled, self._last_draw = True, now
        data = timeline_data(snap, self._offset_s)
        self._in_document(lambda: self._draw(data))

    def _draw(self, data: Data) -> None:
        with self._lock:
            self._scheduled = False
        for name, cols in data.items():
            if self._sent.get(name) != cols:
                self.sources[name].data = cols
                self._sent[name] = cols
        _legend_present(self.figure, data)

    def _in_document(self, change: Callable[[], None]) -> None:
        """Run ``change`` (which edits Bokeh models) where that is safe, and send it."""
        doc = self.figure.document
        if doc is None:
            change()  # not shown yet: the first render sends the data
        elif doc.session_context is not None:
            try:  # served: only the session's event loop may touch its document
                doc.add_next_tick_callback(change)
            except Exception:  # the session ended meanwhile
                with self._lock:
                    self._scheduled = False
        else:  # notebook: change now and push over the comm (thread-safe, needs no loop)
            change()
            pn.io.push_notebook(self._pane)
