"""Send Panel's JavaScript to every browser page that shows a widget, a reloaded tab included.

A widget's output is only its document and a script that draws it with BokehJS and Panel's
JavaScript, which ``pn.extension(inline=True)`` publishes once, as an output of its own. The
JavaScript lives in the page, not in the kernel: when the user reloads the browser tab (the
kernel still running), the new page has none of it. Calling ``pn.extension`` once per kernel,
as ckptdash did, then left every widget rendered after the reload blank, with only
"Unable to run Panel code because Bokeh or Panel library is missing" in the browser's console,
until the kernel restarted. Sending it with every widget instead would put about 7 MB into
each widget's output in the notebook file (3.5 MB of JavaScript, written under two MIME types).

Each page talks to the kernel through its own client, whose id is the ``session`` of every
message it sends (JupyterLab makes a new one per page load). So the JavaScript goes out again
exactly when the request that renders a widget comes from a client that has not been sent it.
"""

from __future__ import annotations

import threading
from typing import Any

import panel as pn

from ckptdash.dash.notebook.subshell import current_kernel

_lock = threading.Lock()
_served: set[str | None] = set()  # the clients (pages) sent the JavaScript so far


def requesting_page(kernel: Any) -> str | None:
    """The client id (one per browser page) of the request the kernel is handling, if known."""
    try:
        parent = kernel.get_parent()
    except Exception:  # an ipykernel without get_parent: one page as far as we can tell
        return None
    header = parent.get("header", {}) if isinstance(parent, dict) else {}
    session = header.get("session")
    return str(session) if session else None


def load_javascript() -> bool:
    """Publish Panel's JavaScript (inline, no CDN) unless the page asking has it already.

    Call it in a cell that renders a widget, before the widget's output. True when it was
    published now; False outside a kernel or for a page sent it before.
    """
    kernel = current_kernel()
    if kernel is None:
        return False
    page = requesting_page(kernel)
    with _lock:
        if page in _served:
            return False
        _served.add(page)
    pn.extension("tabulator", inline=True)
    return True
