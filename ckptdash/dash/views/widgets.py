"""The dashboard's Panel building blocks, shared by its views: the stylesheet, the HTML pane
and the read-only table every view is made of, buttons under either naming of Panel's
parameters, the confirmation row of a destructive action, the hover tooltip of the plots.
"""

from __future__ import annotations

from typing import Any, Final

import panel as pn

from ckptdash.dash import compat, theme
from ckptdash.dash.model import DashModel
from ckptdash.dash.views.text import esc

HOVER_TOOLTIP: Final = "<div style='max-width:420px'><b>@title</b><br>@desc{safe}</div>"
"""A plot's hover text: ``title`` in bold, then ``desc`` (HTML the plot escaped itself)."""

CSS: Final = """
:host { max-width: 100%; min-width: 0; }
.ck { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; font-size: 13px;
      color: var(--ck-fg); }
.ck .badge { display: inline-block; padding: 2px 10px; border-radius: 10px; color: white;
             font-weight: 600; font-size: 13px; }
.ck .title { font-size: 18px; font-weight: 600; margin-right: 8px; }
.ck .why { color: var(--ck-soft); margin-left: 8px; }
.ck .grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr));
            gap: 6px 16px; margin: 10px 0 6px 0; }
.ck .grid label { display: block; color: var(--ck-muted); font-size: 11px;
                  text-transform: uppercase; letter-spacing: .03em; }
.ck .grid b { font-size: 14px; font-weight: 600; }
.ck .bar { height: 8px; background: var(--ck-code-bg); border-radius: 4px; overflow: hidden; }
.ck .bar > div { height: 100%; background: #339af0; }
.ck .muted { color: var(--ck-muted); }
.ck code { font-size: 12px; background: var(--ck-code-bg); padding: 1px 4px; border-radius: 3px;
           word-break: break-all; }
.ck table { border-collapse: collapse; width: 100%; }
.ck th { text-align: left; color: var(--ck-muted); font-weight: 500; font-size: 11px;
         text-transform: uppercase; border-bottom: 1px solid var(--ck-line); padding: 3px 6px; }
.ck td { padding: 3px 6px; border-bottom: 1px solid var(--ck-line-soft); vertical-align: top; }
.ck h4 { margin: 4px 0 6px 0; font-size: 14px; }
.ck .st { font-weight: 600; }
.ck .st-pending, .ck .st-received { color: #1971c2; }
.ck .st-applied { color: #2b8a3e; }
.ck .st-rejected, .ck .st-malformed { color: #c92a2a; }
.ck .st-expired { color: #e8590c; }
.ck .problem { color: #c92a2a; font-weight: 600; }
.ck ul.feed { list-style: none; margin: 0; padding: 0; max-height: 180px; overflow-y: auto; }
.ck ul.feed li { padding: 2px 0; border-bottom: 1px solid var(--ck-line-soft);
                 overflow-wrap: anywhere; }
.ck .feed-lost, .ck .feed-problem { color: #c92a2a; }
.ck .feed-signal { color: #e8590c; }
"""


class HtmlPane(pn.pane.HTML):  # type: ignore[misc]
    """Panel's HTML pane, styled with the dashboard's CSS (inside its shadow root), that sends
    only its text when its object changes.

    Panel's own pane sends every property on each change, stylesheets included; in a notebook
    those are rebuilt as links to cdn.holoviz.org (only the first render inlines them), so an
    offline login node would ask the internet for them at every update.
    """

    def __init__(self, object: str = "", **params: Any) -> None:
        super().__init__(object, **{"stylesheets": [*theme.stylesheets(), CSS], **params})

    def _update(self, ref: str, model: Any) -> None:
        model.update(text=compat.pane_properties(self, model.document)["text"])


class ReadOnlyTabulator(pn.widgets.Tabulator):  # type: ignore[misc]
    """A Tabulator whose rows only the server sets (``disabled``: no cell is editable).

    The browser can still send its copy of the rows back with another event (a click's
    batch); in a notebook that copy may predate rows the follower's thread has just added, and
    Panel's merge then fails in pandas ("Must have equal len keys and value") halfway through
    the message, leaving a traceback in the output and the widget's document held. Rows the
    user cannot edit have nothing to tell the server: the copy is ignored.
    """

    def __init__(self, value: Any = None, **params: Any) -> None:
        super().__init__(value, **{**theme.tabulator_options(), **params})

    def _process_data(self, data: Any) -> None:
        return None


def html_pane(**params: Any) -> Any:
    """A full-width :class:`HtmlPane`."""
    return HtmlPane(sizing_mode="stretch_width", **params)


class HtmlView(pn.viewable.Viewer):  # type: ignore[misc]
    """One HTML pane re-rendered from the model whenever the parameters in ``WATCH`` change."""

    WATCH: tuple[str, ...] = ("run",)

    def __init__(self, model: DashModel, **params: Any) -> None:
        super().__init__(**params)
        self.model = model
        self._pane = html_pane(margin=(5, 10))
        model.param.watch(self._render, list(self.WATCH))
        self._render()

    def __panel__(self) -> Any:
        return self._pane

    def html(self) -> str:
        raise NotImplementedError

    def _render(self, *events: object) -> None:
        self._pane.object = self.html()


# Panel 1.9 renamed Button.name/button_type to label/color; older releases have only the former.
_NEW_BUTTON_API: Final = "color" in pn.widgets.Button.param


def button(label: str, color: str = "default", **params: Any) -> Any:
    """A Panel button under either naming of its parameters."""
    if _NEW_BUTTON_API:
        return pn.widgets.Button(label=label, color=color, **params)
    return pn.widgets.Button(name=label, button_type=color, **params)


def relabel(widget: Any, label: str, color: str) -> None:
    """Change a button's text and colour (see :func:`button`)."""
    if _NEW_BUTTON_API:
        widget.param.update(label=label, color=color)
    else:
        widget.param.update(name=label, button_type=color)


def confirmation(question: str, detail: str, confirm: Any, cancel: Any) -> Any:
    """A hidden row that asks ``question`` before a destructive action; show it on the click."""
    return pn.Row(
        HtmlPane(f"<div class='ck'><b>{esc(question)}</b> {esc(detail)}</div>"),
        confirm,
        cancel,
        visible=False,
    )


def button_label(widget: Any) -> str:
    return str(widget.label if _NEW_BUTTON_API else widget.name)


def theme_toggle() -> Any:
    """The served page's "Dark theme" / "Light theme" button (reloads the page in it)."""
    dark = theme.is_dark()
    toggle = button("Light theme" if dark else "Dark theme", "default", width=110)
    toggle.js_on_click(args={"target": "default" if dark else theme.DARK}, code=theme.TOGGLE_JS)
    return toggle
