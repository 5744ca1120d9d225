"""How snapshots from the watcher's thread reach one dashboard session's widgets.

Panel sends a widget's change only to the Bokeh models that exist at that
moment. A change made from another thread while a session is still building
its models (the page is being rendered) is therefore lost for good: the
Save-now button stayed disabled on a loaded page until it was reloaded. So a
snapshot is never applied while the view renders:

* on a server, it is applied on the session's own event loop (the only
  thread that builds or changes that document), coalesced to the newest;
* in a notebook, where the kernel's main thread is busy training and the
  widget must update from the watcher's thread, rendering and applying hold
  one lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from panel.io.state import set_curdoc

from ckptdash.dash.snapshot import FolderSnapshot

log = logging.getLogger(__name__)


class Delivery:
    """Calls ``apply`` with watcher snapshots where the session's models can take them.

    ``doc`` is the session's Bokeh document when served, None in a notebook.
    """

    def __init__(self, apply: Callable[[FolderSnapshot], None], doc: Any | None) -> None:
        self._apply = apply
        self._doc = doc if doc is not None and doc.session_context is not None else None
        self.render_lock = threading.RLock()  # held while a notebook renders the view
        self._pending_lock = threading.Lock()
        self._pending: FolderSnapshot | None = None
        self._closed = False

    def __call__(self, folder: FolderSnapshot) -> None:
        """Take a snapshot (from any thread)."""
        if self._closed:
            return
        if self._doc is None:
            with self.render_lock:
                self._apply(folder)
            return
        with self._pending_lock:
            scheduled = self._pending is not None
            self._pending = folder  # a slow event loop gets the newest, not a backlog
        if not scheduled:
            try:
                self._doc.add_next_tick_callback(self._flush)  # Bokeh: safe from any thread
            except Exception:  # the session is gone; close() follows
                log.debug("ckptdash: session closed; snapshot dropped", exc_info=True)

    def _flush(self) -> None:
        with self._pending_lock:
            folder, self._pending = self._pending, None
        if folder is None or self._closed:
            return
        with set_curdoc(self._doc):
            self._apply(folder)

    def close(self) -> None:
        self._closed = True
