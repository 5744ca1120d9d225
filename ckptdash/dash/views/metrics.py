"""The metrics plot: a heartbeat metric (loss by default) against the training step, with the
run's checkpoint saves on the same step axis, so that a divergence shows against the
checkpoints around it; anomalies are marked, and so is the resume pin.

Click the plot to choose the valid checkpoint nearest to that step, then "Resume from chosen
save" pins it — through the same control action as the checkpoint table's button.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import Any, Final

import panel as pn
from bokeh.events import Tap
from bokeh.models import ColumnDataSource, HoverTool
from bokeh.plotting import figure

from ckptdash import humanize
from ckptdash.dash import theme
from ckptdash.dash.feed.snapshot import RunSnapshot
from ckptdash.dash.model import DashModel
from ckptdash.dash.views.controls import Controls
from ckptdash.dash.views.text import esc
from ckptdash.dash.views.timeline import TRIGGER_COLORS
from ckptdash.dash.views.widgets import HOVER_TOOLTIP, HtmlPane, button
from ckptdash.state.records import CheckpointInfo, MetricPoint

ATTEMPT_COLORS: Final = ("#495057", "#1c7ed6", "#2b8a3e", "#e8590c", "#862e9c", "#0b7285")
PLOT_NAME: Final = "ckptdash-metrics"
"""The figure's Bokeh name (the browser test finds the plot by it)."""

Data = dict[str, dict[str, list[Any]]]
_LABEL: Final = "label" if "label" in pn.widgets.Select.param else "name"  # Panel 1.9 renamed it


def _order(name: str) -> tuple[bool, bool, str]:
    return (name != "loss", "loss" not in name, name)


def metric_names(snap: RunSnapshot | None) -> list[str]:
    """Every metric name the run's heartbeats carry; ``loss`` (or a ``…loss…``) first."""
    if snap is None:
        return []
    return sorted({n for pts in snap.metrics.values() for p in pts for n in p.metrics}, key=_order)


def _value(p: MetricPoint, metric: str) -> float | None:
    v = p.metrics.get(metric)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


_Index = dict[int | None, tuple[list[int], list[MetricPoint]]]
_INDEXES: dict[tuple[int, str | None], tuple[object, _Index]] = {}


def _by_step(points: list[MetricPoint]) -> tuple[list[int], list[MetricPoint]]:
    ordered = sorted(points, key=lambda p: (p.step, p.t))
    return [p.step for p in ordered], ordered


def _index(snap: RunSnapshot, metric: str | None) -> _Index:
    """Per attempt (None: all of them), its points sorted by step, for bisection; kept for the
    snapshot's metrics (an immutable part shared by snapshots until a heartbeat arrives)."""
    key = (id(snap.metrics), metric)
    hit = _INDEXES.get(key)
    if hit is not None and hit[0] is snap.metrics:
        return hit[1]
    index: _Index = {}
    every: list[MetricPoint] = []
    for n, pts in snap.metrics.items():
        kept = [p for p in pts if metric is None or _value(p, metric) is not None]
        every += kept
        index[n] = _by_step(kept)
    index[None] = _by_step(every)
    if len(_INDEXES) >= 32:  # a few snapshots × metrics; older ones are not drawn again
        _INDEXES.clear()
    _INDEXES[key] = (snap.metrics, index)
    return index


def nearest(
    snap: RunSnapshot, step: int | None, attempt: int | None, metric: str | None = None
) -> MetricPoint | None:
    """The heartbeat nearest to ``step`` in the saving attempt's series (any attempt's if it
    has none); on a tie, the earlier step. The metrics a model had at that save. With
    ``metric``, only heartbeats where it has a finite value count."""
    if step is None:
        return None
    index = _index(snap, metric)
    steps, points = index.get(attempt) or ([], [])
    if not points:
        steps, points = index[None]
    i = bisect.bisect_left(steps, step)
    near = points[max(0, i - 1) : i + 1]
    return min(near, key=lambda p: (abs(p.step - step), p.step), default=None)


def metrics_at_save(snap: RunSnapshot, c: CheckpointInfo) -> str:
    """``val_loss 0.301 (monitored) · loss 0.412 · acc 0.91 (step 1,200)``: what a
    ModelCheckpoint monitored at the save itself, then the metrics nearest it, for the table."""
    monitored = [f"{n} {_shown(v)} (monitored)" for n, v in sorted((c.monitored or {}).items())]
    p = nearest(snap, c.step, c.attempt)
    if p is None or not p.metrics:
        return " · ".join(monitored)
    values = [
        f"{n} {_shown(v)}"
        for n in sorted(p.metrics, key=_order)
        if n not in (c.monitored or {}) and (v := _value(p, n)) is not None
    ]
    at = "" if p.step == c.step or not values else f" (step {p.step:,})"
    return " · ".join(monitored + values[:4]) + at


def _shown(v: float) -> str:
    return humanize.number(v, 4) if abs(v) < 1e4 else f"{v:.3g}"


def metrics_data(snap: RunSnapshot | None, metric: str, log: bool = False) -> Data:
    """The columns of every glyph: a line per attempt, the saves, the pin, the anomalies."""
    d: Data = {
        name: {c: [] for c in cols}
        for name, cols in {
            "lines": ["xs", "ys", "color", "title", "desc"],
            "saves": ["x", "y", "color", "path", "title", "desc"],
            "pin": ["x", "y", "title", "desc"],
            "anomalies": ["x", "y", "title", "desc"],
        }.items()
    }
    if snap is None or not metric:
        return d

    def ok(v: float | None) -> bool:
        return v is not None and (v > 0 or not log)

    for n, pts in snap.metrics.items():
        xs, ys = [], []
        for p in pts:
            v = _value(p, metric)
            if ok(v):
                xs.append(p.step)
                ys.append(v)
        if xs:
            line = d["lines"]
            line["xs"].append(xs)
            line["ys"].append(ys)
            line["color"].append(ATTEMPT_COLORS[n % len(ATTEMPT_COLORS)])
            line["title"].append(f"attempt {n}: {metric}")
            line["desc"].append(esc(f"steps {xs[0]:,} → {xs[-1]:,}"))
    pin = snap.settings.resume_pin if snap.settings is not None else None
    for c in snap.checkpoints:
        if c.step is None or c.status != "saved" or not _offered(c):
            continue  # only what a resume may load is drawn to be chosen
        at = nearest(snap, c.step, c.attempt, metric)
        v = _value(at, metric) if at is not None else None
        if not ok(v):
            continue
        s = d["saves"]
        s["x"].append(c.step)
        s["y"].append(v)
        s["color"].append(TRIGGER_COLORS.get(c.trigger, "#868e96"))
        s["path"].append(c.path)
        s["title"].append(f"checkpoint step {c.step:,} ({c.trigger})")
        s["desc"].append(esc(f"{c.path} · {metric} {v:.4g} · click to choose"))
        if pin and c.path == pin:
            d["pin"]["x"].append(c.step)
            d["pin"]["y"].append(v)
            d["pin"]["title"].append("resume pin")
            d["pin"]["desc"].append(esc(f"the next attempt resumes from {c.path}"))
    for a in snap.anomalies:
        if a.step is None:
            continue
        v = a.value if a.metric == metric and a.value is not None else None
        if v is None or not ok(v):
            near = nearest(snap, a.step, a.attempt, metric)  # a NaN is drawn where it began
            v = _value(near, metric) if near is not None else None
        if not ok(v):
            continue
        an = d["anomalies"]
        an["x"].append(a.step)
        an["y"].append(v)
        an["title"].append(f"anomaly in {a.metric} at step {a.step:,}")
        an["desc"].append(esc(a.reason))
    return d


def render_anomalies(snap: RunSnapshot | None, limit: int = 3) -> str:
    """The newest anomalies, one line each: where, why, and what the job did."""
    if snap is None or not snap.anomalies:
        return ""
    lines = []
    for a in snap.anomalies[-limit:]:
        step = "?" if a.step is None else f"{a.step:,}"
        did = {"record": "recorded", "stop": "stopped", "rollback": "rolled back"}.get(
            a.action, a.action
        )
        pinned = f"; pinned <code>{esc(a.pinned)}</code>" if a.pinned else ""
        lines.append(
            f"<div class='anomaly'><b style='color:#c92a2a'>anomaly</b> at step {step}"
            f" (attempt {a.attempt}): {esc(a.reason)} — {esc(did)}{pinned}</div>"
        )
    return "<div class='ck'>" + "".join(lines) + "</div>"


def _offered(c: CheckpointInfo) -> bool:
    """Whether a click may choose ``c`` to pin: it resumes training (no artifact) and is no
    link or copy of another checkpoint (that one is drawn)."""
    return c.resumable and c.same_as is None


def choose(snap: RunSnapshot | None, step: float) -> CheckpointInfo | None:
    """The valid checkpoint that resumes training whose step is nearest ``step`` (the newer
    one on a tie); artifacts are never offered."""
    if snap is None or not math.isfinite(step):
        return None
    valid = [
        c for c in snap.checkpoints if c.status == "saved" and c.step is not None and _offered(c)
    ]
    return min(valid, key=lambda c: (abs((c.step or 0) - step), -(c.step or 0)), default=None)


class MetricsPlot(pn.viewable.Viewer):  # type: ignore[misc]
    """A metric against the step, with the saves on it; click to choose a checkpoint to pin."""

    def __init__(self, model: DashModel, controls: Controls, height: int = 260, **params: Any):
        super().__init__(**params)
        self.model = model
        self.controls = controls
        self.sources = {n: ColumnDataSource(c) for n, c in metrics_data(None, "").items()}
        themed = {"stylesheets": [theme.WIDGET_LABEL_CSS]}  # labels in JupyterLab's colour
        self.select = pn.widgets.Select(**{_LABEL: "metric"}, options=[], width=200, **themed)
        self.log = pn.widgets.Checkbox(
            **{_LABEL: "log scale"}, value=False, margin=(28, 10, 0, 10), **themed
        )
        self.pin_button = button("Resume from chosen save", "primary", disabled=True)
        self.pin_button.on_click(self._pin)
        self.chosen: CheckpointInfo | None = None
        self._note = HtmlPane(margin=(5, 10))
        self._anomalies = HtmlPane(margin=(0, 10))
        self._height = height
        self._pane = pn.pane.Bokeh(self._figure(False), sizing_mode="stretch_width")
        self._sent: Data = {}
        self._layout = pn.Column(
            pn.Row(
                HtmlPane("<div class='ck'><h4>Metrics</h4></div>", width=90),
                self.select,
                self.log,
                self.pin_button,
                self._note,
                sizing_mode="stretch_width",
            ),
            self._pane,
            self._anomalies,
            sizing_mode="stretch_width",
            visible=False,
        )
        self.select.param.watch(self._redraw, "value")
        self.log.param.watch(self._on_log, "value")
        model.param.watch(self._on_run, ["run"])
        self._on_run()

    def __panel__(self) -> Any:
        return self._layout

    def _figure(self, log: bool) -> Any:
        s = self.sources
        fig = figure(
            name=PLOT_NAME,
            height=self._height,
            sizing_mode="stretch_width",
            x_axis_label="step",
            y_axis_type="log" if log else "linear",
            tools="xpan,xwheel_zoom,box_zoom,reset,save",
            active_scroll="xwheel_zoom",
            toolbar_location="right",
        )
        fig.xgrid.grid_line_alpha = 0.3
        fig.ygrid.grid_line_alpha = 0.3
        hover = [
            fig.multi_line(xs="xs", ys="ys", source=s["lines"], color="color", line_width=2),
            fig.scatter(
                "x",
                "y",
                source=s["saves"],
                size=10,
                color="color",
                line_color="white",
                legend_label="checkpoint",
            ),
            fig.scatter(
                "x",
                "y",
                source=s["pin"],
                size=18,
                marker="circle",
                fill_alpha=0,
                line_color="#1971c2",
                line_width=3,
                legend_label="resume pin",
            ),
            fig.scatter(
                "x",
                "y",
                source=s["anomalies"],
                size=14,
                marker="x",
                line_width=3,
                color="#c92a2a",
                legend_label="anomaly",
            ),
        ]
        fig.add_tools(HoverTool(renderers=hover, tooltips=HOVER_TOOLTIP))
        legend = fig.legend[0]
        legend.click_policy = "hide"
        legend.label_text_font_size = "11px"
        legend.border_line_alpha = 0
        fig.add_layout(legend, "right")
        theme.style_figure(fig, served=theme.served())
        fig.on_event(Tap, self._on_tap)
        return fig

    # --- updates -------------------------------------------------------------------------------

    def _on_run(self, *events: object) -> None:
        snap = self.model.run
        names = metric_names(snap)
        self._layout.visible = bool(names)
        if names != list(self.select.options):
            keep = self.select.value if self.select.value in names else names[0] if names else None
            self.select.param.update(options=names, value=keep)
        self._anomalies.object = render_anomalies(snap)
        if self.chosen is not None and (snap is None or self.chosen.path not in snap.valid_paths()):
            self.chosen = None
        self._redraw()

    def _on_log(self, *events: object) -> None:
        self._sent = {}
        self._pane.object = self._figure(bool(self.log.value))
        self._redraw()

    def _redraw(self, *events: object) -> None:
        data = metrics_data(self.model.run, self.select.value or "", bool(self.log.value))
        changed = {n: c for n, c in data.items() if self._sent.get(n) != c}
        self._sent.update(changed)
        if changed:
            self._in_document(lambda: self._draw(changed))
        self._update_choice()

    def _draw(self, changed: Data) -> None:
        for name, cols in changed.items():
            self.sources[name].data = cols

    def _in_document(self, change: Callable[[], None]) -> None:
        """Edit Bokeh models where that is safe, and send the change (as the timeline does)."""
        fig = self._pane.object
        doc = fig.document
        if doc is None:
            change()  # not shown yet: the first render sends the data
        elif doc.session_context is not None:
            try:  # served: only the session's event loop may touch its document
                doc.add_next_tick_callback(change)
            except Exception:  # the session ended meanwhile
                self._sent = {}
        else:  # notebook: change now and push over the comm
            change()
            pn.io.push_notebook(self._pane)

    # --- choosing a checkpoint -----------------------------------------------------------------

    def _on_tap(self, event: Any) -> None:
        # Browser input: only a number, mapped to a checkpoint this run recorded.
        x = event.x
        if isinstance(x, int | float):
            self.chosen = choose(self.model.run, float(x))
            self._update_choice()

    def _update_choice(self) -> None:
        c = self.chosen
        if c is None:
            self._note.object = (
                "<div class='ck muted'>click the plot to choose the checkpoint nearest that step"
                "</div>"
            )
            self.pin_button.disabled = True
            return
        self._note.object = (
            f"<div class='ck'>chosen: <b class='chosen-step'>step {c.step:,}</b>"
            f" ({esc(c.trigger)}) <code>{esc(c.path)}</code></div>"
        )
        self.pin_button.disabled = bool(self.controls.actions.locked)

    def _pin(self, _: object) -> None:
        c = self.chosen
        if c is None:
            self.controls.say("click the metrics plot to choose a checkpoint first", problem=True)
            return
        path = c.path
        self.controls.run_action(lambda: self.controls.actions.pin(path))
