"""How values from a background thread (the follower's snapshots, the scheduler's answers)
reach one dashboard session's widgets.

Panel sends a widget's change only to the Bokeh models that exist at that
moment. A change made from another thread while a session is still building
its models (the page is being rendered) is therefore lost for good: the
Save-now button stayed disabled on a loaded page until it was reloaded. So a
value is never applied while the view renders:

* on a server, values wait until the page has loaded (Panel's ``onload``; the
  newest one is kept), then are applied from the background thread, which
  makes Panel schedule each model change on the session's event loop: its
  standard path for changes from other threads. (Applying them *on* the event
  loop instead, in a next-tick callback, sends them through Panel's direct
  websocket writes, which now and then lost one on a page that had just
  loaded.)
* in a notebook, where the kernel's main thread is busy training and the
  widget must update from the follower's thread, rendering and applying hold
  one lock; and once the widget is rendered, values wait (the newest is kept)
  until ``gate`` says its comms are open: Panel drops a change it cannot send
  yet, and a dropped change is never sent again (see :mod:`ckptdash.dash.notebook.kernelcomms`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Delivery(Generic[T]):
    """Calls ``apply`` with values from any thread once the session's models can take them.

    ``doc`` is the session's Bokeh document when served (then call :meth:`ready`
    once the page has loaded), None in a notebook. Deliveries of one session
    share ``render_lock`` (the first one's, by default).
    """

    def __init__(
        self,
        apply: Callable[[T], None],
        doc: Any | None,
        *,
        render_lock: threading.RLock | None = None,
        gate: Callable[[], bool] | None = None,
    ) -> None:
        self._apply = apply
        self._gate = gate
        self._served = doc is not None and doc.session_context is not None
        # Held while a notebook renders the view.
        self.render_lock = render_lock if render_lock is not None else threading.RLock()
        self._lock = threading.Lock()
        self._ready = not self._served
        self._pending: T | None = None
        self._closed = False

    def __call__(self, value: T) -> None:
        """Take a value (from any thread)."""
        if self._closed:
            return
        if self._served:
            with self._lock:
                if not self._ready:
                    self._pending = value  # the newest waits for the page
                    return
            self._apply(value)
            return
        with self.render_lock:
            if self._gate is not None and not self._gate():
                self._pending = value  # the newest waits for the widget's comms
                return
            self._pending = None
            self._apply(value)

    def ready(self) -> None:
        """The page has loaded: apply what waited, and from now on every value at once."""
        with self._lock:
            self._ready = True
            value, self._pending = self._pending, None
        if value is not None and not self._closed:
            self._apply(value)

    def close(self) -> None:
        self._closed = True
