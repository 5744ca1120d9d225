"""How values from a background thread (the watcher's snapshots, the scheduler's answers)
reach one dashboard session's widgets.

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
from typing import Any, Generic, TypeVar

from panel.io.state import set_curdoc

log = logging.getLogger(__name__)

T = TypeVar("T")


class Delivery(Generic[T]):
    """Calls ``apply`` with values from any thread where the session's models can take them;
    a burst is coalesced to the newest value.

    ``doc`` is the session's Bokeh document when served, None in a notebook.
    Deliveries of one session share ``render_lock`` (the first one's, by default).
    """

    def __init__(
        self,
        apply: Callable[[T], None],
        doc: Any | None,
        *,
        render_lock: threading.RLock | None = None,
    ) -> None:
        self._apply = apply
        self._doc = doc if doc is not None and doc.session_context is not None else None
        # Held while a notebook renders the view.
        self.render_lock = render_lock if render_lock is not None else threading.RLock()
        self._pending_lock = threading.Lock()
        self._pending: T | None = None
        self._closed = False

    def __call__(self, value: T) -> None:
        """Take a value (from any thread)."""
        if self._closed:
            return
        if self._doc is None:
            with self.render_lock:
                self._apply(value)
            return
        with self._pending_lock:
            scheduled = self._pending is not None
            self._pending = value  # a slow event loop gets the newest, not a backlog
        if not scheduled:
            try:
                self._doc.add_next_tick_callback(self._flush)  # Bokeh: safe from any thread
            except Exception:  # the session is gone; close() follows
                log.debug("ckptdash: session closed; snapshot dropped", exc_info=True)

    def _flush(self) -> None:
        with self._pending_lock:
            value, self._pending = self._pending, None
        if value is None or self._closed:
            return
        with set_curdoc(self._doc):
            self._apply(value)

    def close(self) -> None:
        self._closed = True
