"""Light and dark: the served page follows the system's theme and has a toggle; the notebook
widget follows JupyterLab's.

* Served (``ckptdash serve``): Panel reads the page's ``?theme=dark`` (``pn.config.theme``,
  per session). A browser whose system prefers dark and whose URL names no theme is sent to
  ``?theme=dark`` once, on load (:func:`follow_system`);
  :func:`~ckptdash.dash.views.widgets.theme_toggle` flips it. Each
  session then builds its widgets for its theme: the dark palette for the dashboard's own
  HTML (:data:`DARK_CSS`), Tabulator's ``midnight`` theme, dark plots (:func:`style_figure`).
* In JupyterLab the page's theme is only known in the browser: the dashboard's colours are
  JupyterLab's own CSS variables (``--jp-content-font-color1``, ``--jp-layout-color0`` …,
  which reach into Panel's shadow roots), with the light colours as their fallback, and the
  plots are transparent with mid-grey text, readable on either.
"""

from __future__ import annotations

from typing import Any, Final

import panel as pn

LIGHT_VARS: Final = """
:host {
  --ck-fg: var(--jp-content-font-color1, #212529);
  --ck-soft: var(--jp-content-font-color2, #495057);
  --ck-muted: var(--jp-content-font-color3, #868e96);
  --ck-code-bg: var(--jp-layout-color2, #f1f3f5);
  --ck-line: var(--jp-border-color2, #dee2e6);
  --ck-line-soft: var(--jp-border-color3, #f1f3f5);
  --ck-alert-bg: var(--jp-layout-color1, #fff5f5);
}
"""
"""The palette every dashboard stylesheet uses: JupyterLab's variables where they exist."""

DARK_CSS: Final = """
:host {
  --ck-fg: #e9ecef;
  --ck-soft: #ced4da;
  --ck-muted: #adb5bd;
  --ck-code-bg: #343a40;
  --ck-line: #495057;
  --ck-line-soft: #343a40;
  --ck-alert-bg: #3b2326;
}
"""
"""The served page's dark palette (after :data:`LIGHT_VARS`: it wins)."""

TABULATOR_CSS: Final = """
.tabulator, .tabulator .tabulator-header, .tabulator .tabulator-header .tabulator-col,
.tabulator .tabulator-tableholder, .tabulator-row, .tabulator-row.tabulator-row-even,
.tabulator .tabulator-footer {
  background-color: var(--jp-layout-color0);
  color: var(--jp-content-font-color1);
}
"""
"""Tables in JupyterLab take its colours (outside it, the variables are unset: transparent
rows on the page's own background, text in the page's colour)."""

WIDGET_LABEL_CSS: Final = """
:host, label, .bk-input-group { color: var(--jp-content-font-color1, inherit); }
"""
"""A Panel widget's label in JupyterLab's text colour (Panel draws it dark on any page)."""

DARK: Final = "dark"
PAGE_BG_DARK: Final = "#1e1f22"
TEXT_DARK: Final = "#ced4da"
TEXT_EITHER: Final = "#868e96"
"""Mid-grey: readable on a light and on a dark page (the notebook's plots)."""

FOLLOW_SYSTEM_JS: Final = """
const url = new URL(window.location.href);
if (!url.searchParams.has('theme') && window.matchMedia
    && window.matchMedia('(prefers-color-scheme: dark)').matches) {
  url.searchParams.set('theme', 'dark');
  window.location.replace(url.toString());
}
"""

TOGGLE_JS: Final = """
const url = new URL(window.location.href);
url.searchParams.set('theme', target);
window.location.replace(url.toString());
"""


def is_dark() -> bool:
    """This session's page is dark (a served page with ``?theme=dark``)."""
    return bool(pn.config.theme == DARK)


def stylesheets() -> list[str]:
    """The stylesheets of one of the dashboard's HTML panes, for this session's theme."""
    return [LIGHT_VARS, DARK_CSS] if is_dark() else [LIGHT_VARS]


def tabulator_options() -> dict[str, Any]:
    """Tabulator parameters for this session's theme."""
    if is_dark():
        return {"theme": "midnight"}
    return {"stylesheets": [TABULATOR_CSS]}


def style_figure(fig: Any, *, served: bool) -> None:
    """Colour a Bokeh figure for this session: dark on a dark page, transparent with mid-grey
    text in a notebook (JupyterLab light or dark), as drawn on a light page."""
    if is_dark():
        background: str | None = PAGE_BG_DARK
        text = TEXT_DARK
    elif not served:
        background, text = None, TEXT_EITHER
    else:
        return
    if background is None:
        fig.background_fill_alpha = 0
        fig.border_fill_alpha = 0
    else:
        fig.background_fill_color = background
        fig.border_fill_color = background
    for axis in [*fig.xaxis, *fig.yaxis]:
        axis.axis_label_text_color = text
        axis.major_label_text_color = text
        axis.axis_line_color = text
        axis.major_tick_line_color = text
        axis.minor_tick_line_color = text
    for grid in [*fig.xgrid, *fig.ygrid]:
        grid.grid_line_color = TEXT_EITHER
    for legend in fig.legend:
        legend.label_text_color = text
        if background is None:
            legend.background_fill_alpha = 0
        else:
            legend.background_fill_color = background
    fig.title.text_color = text


def served() -> bool:
    """This code runs for a served page's session (not a notebook)."""
    doc = pn.state.curdoc
    return doc is not None and doc.session_context is not None


def follow_system(doc: Any) -> None:
    """On a served page whose URL names no theme, switch to dark once if the system is."""
    from bokeh.models import CustomJS

    doc.js_on_event("document_ready", CustomJS(code=FOLLOW_SYSTEM_JS))
