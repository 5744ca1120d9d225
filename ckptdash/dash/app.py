"""The dashboard: one :class:`Dashboard` object is both the notebook widget and the served app.

    ckptdash serve RUN_DIR                       # a browser tab (127.0.0.1:5006)
    panel serve ckptdash --args RUN_DIR          # from the repository root
    ckptdash.dashboard("runs/exp1")              # a notebook cell; keeps updating during fit()

Every session gets its own model and widgets; the follower of a path is
shared by all of them (kept in ``pn.state.cache``) and stopped when the last
session ends. Nothing is ever fetched from a CDN: login nodes are often
offline, so the server sends its own copies of the JavaScript, and the
notebook gets them inline.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import panel as pn

from ckptdash.dash import compat, theme
from ckptdash.dash.delivery import Delivery
from ckptdash.dash.feed.follow import RunFollower
from ckptdash.dash.feed.hub import FollowerHub, shared_hub
from ckptdash.dash.feed.mounts import WATCH_MODES, WatchMode
from ckptdash.dash.feed.snapshot import FolderSnapshot
from ckptdash.dash.model import DEFAULT_STALE_AFTER_S, DashModel
from ckptdash.dash.notebook import embed, pages
from ckptdash.dash.notebook.kernelcomms import open_off_main_thread
from ckptdash.dash.notebook.subshell import SubshellRoute, current_kernel
from ckptdash.dash.views import CommandsView, GoodputView, RunList, StatusHeader
from ckptdash.dash.views.checkpoints import CheckpointTable
from ckptdash.dash.views.controls import ControlActions, Controls, default_author
from ckptdash.dash.views.events import EventsFeed
from ckptdash.dash.views.goodput_bars import BadputView
from ckptdash.dash.views.health import HealthBanner, RanksView
from ckptdash.dash.views.metrics import MetricsPlot
from ckptdash.dash.views.scheduler import SchedulerPanel
from ckptdash.dash.views.text import esc
from ckptdash.dash.views.timeline import Timeline
from ckptdash.dash.views.widgets import html_pane, theme_toggle
from ckptdash.errors import CkptDashError

RUN_DIR_ENV: Final = "CKPTDASH_RUN_DIR"
"""The run directory (or folder of runs) when none is given: this variable, else ``./runs``."""
FIRST_READ_WAIT_S: Final = 10.0
"""How long ``dashboard()`` waits for the first read of its path (a 1M-event log: ~1 s)."""


def default_path() -> str:
    """What to show when no path was given: ``$CKPTDASH_RUN_DIR``, else ``./runs``."""
    return os.environ.get(RUN_DIR_ENV) or "runs"


@dataclass(frozen=True)
class DashOptions:
    """How a dashboard watches its path. Checks itself; messages say what to change."""

    watch: WatchMode = "auto"
    """``auto`` (inotify, or polling on NFS/Lustre), ``inotify`` or ``poll``."""
    poll_interval_s: float = 1.0
    """Seconds between polls in polling mode (raise it on a busy network filesystem)."""
    stale_after_s: float = DEFAULT_STALE_AFTER_S
    """A running attempt silent for this long is shown as stale."""
    controls_off: str = ""
    """Why this page may only watch ("": its controls act). ``panel serve ckptdash`` without
    a login sets it (``ckptdash/main.py``); shown on the page, checked at every action."""

    def __post_init__(self) -> None:
        if self.watch not in WATCH_MODES:
            raise CkptDashError(f"watch={self.watch!r}: use one of {', '.join(WATCH_MODES)}")
        if not self.poll_interval_s > 0:
            raise CkptDashError(
                f"poll_interval_s={self.poll_interval_s!r}: must be a positive number of seconds"
            )
        if not self.stale_after_s > 0:
            raise CkptDashError(
                f"stale_after_s={self.stale_after_s!r}: must be a positive number of seconds"
            )


class Dashboard(pn.viewable.Viewer):  # type: ignore[misc]
    """The whole dashboard for a run directory or a folder of runs.

    Display it in a notebook (``ckptdash.dashboard(path)``) or serve it
    (``ckptdash serve``). Call :meth:`close` when done with a notebook widget;
    a served session closes itself when the browser tab is gone. ``first_read_s``:
    how long to wait for the follower's first read, so that the first render shows it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        options: DashOptions | None = None,
        hub: FollowerHub | None = None,
        first_read_s: float = 0.0,
        **params: Any,
    ) -> None:
        super().__init__(**params)
        self.path = Path(path if path is not None else default_path())
        self.options = options or DashOptions()
        self._hub = hub if hub is not None else shared_hub(pn.state.cache)
        self.model = DashModel(path=str(self.path), stale_after_s=self.options.stale_after_s)
        self.actions = ControlActions(
            self.model,
            author=_author,
            nudge=lambda: self.follower.wake(),
            mirror_requeue=lambda suspended: self.scheduler.mirror_requeue(suspended),
            locked=self.options.controls_off,
        )
        self.header = StatusHeader(self.model)
        self.alerts = HealthBanner(self.model)
        self.runs = RunList(self.model)
        self.controls = Controls(self.model, self.actions)
        doc = pn.state.curdoc
        served = doc is not None and doc.session_context is not None
        # In a kernel the widget's clicks go to a subshell, so they act while a cell trains.
        self._subshells = SubshellRoute() if not served and _in_kernel() else None
        self._delivery = Delivery(
            self._take, doc, gate=self._comms_open if self._subshells is not None else None
        )
        self.scheduler = SchedulerPanel(
            self.model,
            self.controls,
            doc=doc,
            render_lock=self._delivery.render_lock,
            alive=lambda: self.follower.running,  # started after the follower is acquired
        )
        # Views update in the order they were made: the table's small message before the plot's
        # (a plot redraw costs the browser ~50 ms; a new checkpoint should not wait for it).
        self.table = CheckpointTable(self.model, self.controls)
        self.ranks = RanksView(self.model)  # after the table: a new row first, then the ranks
        self.timeline = Timeline(self.model)
        self.commands = CommandsView(self.model)
        self.feed = EventsFeed(self.model)
        self.goodput = GoodputView(self.model)
        self.badput = BadputView(self.model)
        self.metrics = MetricsPlot(self.model, self.controls)
        self._title = html_pane()
        self.model.param.watch(self._render_title, ["watching"])
        self._render_title()
        top: Any = self._title
        if served:  # a notebook follows JupyterLab's theme; a served page has a toggle
            theme.follow_system(doc)
            self.theme_toggle = theme_toggle()
            top = pn.Row(self._title, self.theme_toggle, sizing_mode="stretch_width")
        self._layout = pn.Column(
            top,
            self.runs,
            self.header,
            self.alerts,
            self.controls,
            self.scheduler,
            self.feed,
            self.timeline,
            self.metrics,
            pn.Row(
                pn.Column(self.badput, self.goodput, sizing_mode="stretch_width"),
                self.commands,
                sizing_mode="stretch_width",
            ),
            self.ranks,
            self.table,
            sizing_mode="stretch_width",
        )
        self._close_lock = threading.Lock()
        self._closed = False
        # Last, so that nothing above can fail while holding a share of the follower.
        self.follower: RunFollower = self._hub.acquire(
            self.path, mode=self.options.watch, poll_interval_s=self.options.poll_interval_s
        )
        # No view is rendered yet: the first paint shows the run as the follower last read it
        # (after waiting up to ``first_read_s`` for a first read).
        if first_read_s > 0:
            self.follower.wait_loaded(first_read_s)
        # The selected run is kept whole: in a folder, idle runs the page does not show rest.
        self._let_go: Callable[[], None] = lambda: None
        self._focus_lock = threading.Lock()  # the follower's thread and the session's select
        self.model.param.watch(self._focus_selected, ["selected"])
        if (latest := self.follower.latest) is not None:
            self.model.publish(latest)
        self._focus_selected()
        self._unsubscribe = self.follower.subscribe(self._delivery)
        if doc is not None and doc.session_context is not None:
            pn.state.on_session_destroyed(lambda _context: self.close())
            pn.state.onload(self._page_loaded)  # from then on the views take every update

    def _focus_selected(self, *events: object) -> None:
        with self._focus_lock:
            let_go, selected = self._let_go, self.model.selected
            if self._closed:
                return
            self._let_go = self.follower.focus(selected) if selected else (lambda: None)
        let_go()

    def _take(self, folder: FolderSnapshot) -> None:
        self.model.publish(folder)
        if self._subshells is not None:  # the widget's comms open once the page shows it
            clients = [client for _, client in compat.rendered_comms(self._layout)]
            self._subshells.route(clients, self._delivery.render_lock)

    def _comms_open(self) -> bool:
        """Whether every rendering of the widget can take an update now (its push comm is
        open); True before the first rendering (nothing to push to yet)."""
        return all(
            compat.push_comm_open(server) for server, _ in compat.rendered_comms(self._layout)
        )

    def _page_loaded(self) -> None:
        self._delivery.ready()
        self.scheduler.ready()

    def __panel__(self) -> Any:
        return self._layout

    @contextmanager
    def holding_updates(self) -> Iterator[None]:
        """Apply no snapshot while the block runs (one being applied finishes first).

        For code that changes the widgets from a thread of its own while the
        widget is live in a notebook (a served session's widgets change on its
        event loop: Panel schedules every change there).
        """
        with self._delivery.render_lock:
            yield

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        # A notebook renders here while the follower's thread may be applying a snapshot.
        # The document is inlined in a <script>: event text must not be able to end it.
        embed.install()
        pages.load_javascript()  # a reloaded browser tab is a new page, without Panel's JS
        with self._delivery.render_lock:
            bundle = embed.check_bundle(super()._repr_mimebundle_(include, exclude))
            kernel = current_kernel()
            if kernel is not None:
                # Run All: the next cell may hold the main thread before the front end's
                # comm_open for this rendering arrives; open it off the main thread.
                clients = [client.id for _, client in compat.rendered_comms(self._layout)]
                open_off_main_thread(kernel, clients)
            return bundle

    def close(self) -> None:
        """Stop receiving updates; the follower stops when no other session uses it."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._delivery.close()
        self.scheduler.close()
        self._unsubscribe()
        with self._focus_lock:
            self._let_go()
        self._hub.release(self.follower)

    def _render_title(self, *events: object) -> None:
        self._title.object = (
            f"<div class='ck'><span class='title'>ckptdash</span>"
            f"<span class='muted'>{esc(self.path)} · {esc(self.model.watching)}</span></div>"
        )


def _author() -> str:
    """The logged-in user when Panel's authentication is on, else this process's user."""
    try:
        user = pn.state.user
    except Exception:  # no request (a notebook): there is no logged-in user
        user = None
    return f"{user} (dashboard)" if user else default_author()


def dashboard(path: str | os.PathLike[str] | None = None, **options: Any) -> Dashboard:
    """The dashboard as a notebook widget; it keeps updating while another cell trains.

    Updates come from the follower's thread, which Jupyter lets through while a
    cell blocks. The JavaScript is loaded inline (no CDN), so it works on an
    offline login node. ``options`` are :class:`DashOptions` fields.

    >>> import ckptdash                                   # doctest: +SKIP
    >>> ckptdash.dashboard("runs/exp1")  # doctest: +SKIP
    """
    pages.load_javascript()  # once per browser page: after a reload, again
    # A change sent before the front end has opened the widget's comm is lost, and an idle
    # run sends no other: wait for the first read so that the first render shows the run.
    return Dashboard(path, options=DashOptions(**options), first_read_s=FIRST_READ_WAIT_S)


def _in_kernel() -> bool:
    return current_kernel() is not None
