"""The dashboard: one :class:`Dashboard` object is both the notebook widget and the served app.

    ckptdash serve RUN_DIR                       # a browser tab (127.0.0.1:5006)
    panel serve ckptdash --args RUN_DIR          # from the repository root
    ckptdash.dashboard("runs/exp1")              # a notebook cell; keeps updating during fit()

Every session gets its own model and widgets; the watcher of a path is
shared by all of them (kept in ``pn.state.cache``) and stopped when the last
session ends. Nothing is ever fetched from a CDN: login nodes are often
offline, so the server sends its own copies of the JavaScript, and the
notebook gets them inline.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket
import sys
import threading
import time
import webbrowser
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import panel as pn

from ckptdash.dash import access, embed
from ckptdash.dash.badput_view import BadputView
from ckptdash.dash.controls import ControlActions, Controls, default_author
from ckptdash.dash.delivery import Delivery
from ckptdash.dash.health_view import HealthBanner, RanksView
from ckptdash.dash.hub import WatcherHub, shared_hub
from ckptdash.dash.kernelcomms import open_off_main_thread
from ckptdash.dash.metrics_plot import MetricsPlot
from ckptdash.dash.model import DEFAULT_STALE_AFTER_S, DashModel
from ckptdash.dash.mounts import WATCH_MODES, WatchMode
from ckptdash.dash.slurm_panel import SchedulerPanel
from ckptdash.dash.snapshot import FolderSnapshot
from ckptdash.dash.subshell import SubshellRoute, current_kernel
from ckptdash.dash.table import CheckpointTable
from ckptdash.dash.text import esc
from ckptdash.dash.timeline import Timeline
from ckptdash.dash.views import CommandsView, GoodputView, RunList, StatusHeader, html_pane
from ckptdash.dash.watch import RunWatcher
from ckptdash.errors import CkptDashError
from ckptdash.rundir import find_runs

RUN_DIR_ENV: Final = "CKPTDASH_RUN_DIR"
"""The run directory (or folder of runs) when none is given: this variable, else ``./runs``."""
DEFAULT_PORT: Final = 5006
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
    how long to wait for the watcher's first read, so that the first render shows it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        options: DashOptions | None = None,
        hub: WatcherHub | None = None,
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
            nudge=lambda: self.watcher.wake(),
            mirror_requeue=lambda suspended: self.scheduler.mirror_requeue(suspended),
        )
        self.header = StatusHeader(self.model)
        self.alerts = HealthBanner(self.model)
        self.ranks = RanksView(self.model)
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
            alive=lambda: self.watcher.running,  # started after the watcher is acquired
        )
        # Views update in the order they were made: the table's small message before the plot's
        # (a plot redraw costs the browser ~50 ms; a new checkpoint should not wait for it).
        self.table = CheckpointTable(self.model, self.controls)
        self.timeline = Timeline(self.model)
        self.commands = CommandsView(self.model)
        self.goodput = GoodputView(self.model)
        self.badput = BadputView(self.model)
        self.metrics = MetricsPlot(self.model, self.controls)
        self._title = html_pane()
        self.model.param.watch(self._render_title, ["watching"])
        self._render_title()
        self._layout = pn.Column(
            self._title,
            self.runs,
            self.header,
            self.alerts,
            self.controls,
            self.scheduler,
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
        # Last, so that nothing above can fail while holding a share of the watcher.
        self.watcher: RunWatcher = self._hub.acquire(
            self.path, mode=self.options.watch, poll_interval_s=self.options.poll_interval_s
        )
        # No view is rendered yet: the first paint shows the run as the watcher last read it
        # (after waiting up to ``first_read_s`` for a first read).
        if first_read_s > 0:
            self.watcher.wait_loaded(first_read_s)
        if (latest := self.watcher.latest) is not None:
            self.model.publish(latest)
        self._unsubscribe = self.watcher.subscribe(self._delivery)
        if doc is not None and doc.session_context is not None:
            pn.state.on_session_destroyed(lambda _context: self.close())
            pn.state.onload(self._page_loaded)  # from then on the views take every update

    def _take(self, folder: FolderSnapshot) -> None:
        self.model.publish(folder)
        if self._subshells is not None:  # the widget's comms open once the page shows it
            clients = [client for _, client in list(self._layout._comms.values())]
            self._subshells.route(clients, self._delivery.render_lock)

    def _comms_open(self) -> bool:
        """Whether every rendering of the widget can take an update now (its push comm is
        open); True before the first rendering (nothing to push to yet)."""
        return all(
            getattr(server, "_comm", True) is not None
            for server, _ in list(self._layout._comms.values())
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
        # A notebook renders here while the watcher's thread may be applying a snapshot.
        # The document is inlined in a <script>: event text must not be able to end it.
        embed.install()
        with self._delivery.render_lock:
            bundle = embed.check_bundle(super()._repr_mimebundle_(include, exclude))
            kernel = current_kernel()
            if kernel is not None:
                # Run All: the next cell may hold the main thread before the front end's
                # comm_open for this rendering arrives; open it off the main thread.
                clients = [client.id for _, client in list(self._layout._comms.values())]
                open_off_main_thread(kernel, clients)
            return bundle

    def close(self) -> None:
        """Stop receiving updates; the watcher stops when no other session uses it."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._delivery.close()
        self.scheduler.close()
        self._unsubscribe()
        self._hub.release(self.watcher)

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


_notebook_ready = False


def dashboard(path: str | os.PathLike[str] | None = None, **options: Any) -> Dashboard:
    """The dashboard as a notebook widget; it keeps updating while another cell trains.

    Updates come from the watcher's thread, which Jupyter lets through while a
    cell blocks. The JavaScript is loaded inline (no CDN), so it works on an
    offline login node. ``options`` are :class:`DashOptions` fields.

    >>> import ckptdash                                   # doctest: +SKIP
    >>> ckptdash.dashboard("runs/exp1")                   # last line of a cell: shows it
    """
    global _notebook_ready
    if not _notebook_ready and _in_kernel():
        pn.extension("tabulator", inline=True)
        _notebook_ready = True
    # A change sent before the front end has opened the widget's comm is lost, and an idle
    # run sends no other: wait for the first read so that the first render shows the run.
    return Dashboard(path, options=DashOptions(**options), first_read_s=FIRST_READ_WAIT_S)


def _in_kernel() -> bool:
    return current_kernel() is not None


# --- serving -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServeOptions:
    """Where and how ``ckptdash serve`` listens. Checks itself; messages say what to change."""

    address: str = "127.0.0.1"
    """Listen here. Anything but a loopback address needs ``allow_remote``."""
    port: int = DEFAULT_PORT
    """0 picks a free port."""
    allow_remote: bool = False
    """Allow a non-loopback address: then anyone who reaches the port can try the token."""
    basic_auth: str | dict[str, str] | None = None
    """Panel's login page: one password, or ``{user: password}``. Never from the command line:
    ``ckptdash serve`` reads it from ``--basic-auth FILE`` or ``$CKPTDASH_BASIC_AUTH``."""
    origins: tuple[str, ...] = ()
    """More ``host:port`` names the browser may use (a proxy, an SSH tunnel's local port)."""
    show: bool = False
    """Open a browser tab."""
    token: str | None = None
    """The secret every request must carry (see :mod:`ckptdash.dash.access`); None: a new
    random one at each start."""
    no_auth: bool = False
    """Serve without a token: any local user can then save, stop and requeue your job."""
    allow_hosts: tuple[str, ...] = ()
    """More ``Host`` names the server answers to (a proxy's name); others get 403."""
    certfile: str | None = None
    """TLS certificate (PEM), with ``keyfile``: serve https."""
    keyfile: str | None = None
    """TLS private key (PEM) of ``certfile``."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise CkptDashError(f"port {self.port}: must be 0 (any free port) to 65535")
        if not self.loopback and not self.allow_remote:
            raise CkptDashError(
                f"--address {self.address}: the dashboard's buttons can save, stop and requeue"
                " the job, so it listens on 127.0.0.1 unless told otherwise. Use an SSH tunnel"
                f" (ssh -L {self.port or DEFAULT_PORT}:127.0.0.1:{self.port or DEFAULT_PORT}"
                " LOGIN_NODE), or add --allow-remote (and --certfile/--keyfile for TLS)"
            )
        if (self.certfile is None) != (self.keyfile is None):
            raise CkptDashError(
                "--certfile and --keyfile: give both (the certificate and its private key)"
            )
        if self.token is not None and len(self.token) < 16:
            raise CkptDashError(
                f"token of {len(self.token)} characters: use at least 16 (or leave it unset"
                " for a random one)"
            )

    @property
    def loopback(self) -> bool:
        if self.address == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.address).is_loopback
        except ValueError:
            return False

    @property
    def scheme(self) -> str:
        return "https" if self.certfile else "http"

    def websocket_origins(self, port: int) -> list[str]:
        """The ``host:port`` pages the websocket accepts: this address's names, nothing else."""
        hosts = ["localhost", "127.0.0.1"]
        if not self.loopback:
            if self.address in ("0.0.0.0", "::"):
                hosts += [socket.gethostname(), socket.getfqdn()]
            else:
                hosts.append(self.address)
        hosts += list(self.allow_hosts)
        found = [f"{h}:{port}" for h in dict.fromkeys(hosts)]
        return found + [o for o in self.origins if o not in found]

    def hosts(self) -> tuple[str, ...]:
        """The ``Host`` names every request must use (DNS rebinding: other names get 403)."""
        extra = [*self.allow_hosts, *(o.rsplit(":", 1)[0] for o in self.origins)]
        return access.allowed_hosts(
            self.address, extra, wildcard_names=(socket.gethostname(), socket.getfqdn())
        )

    def security_note(self) -> str:
        """The warnings to print at each start (empty when there is nothing to warn about)."""
        notes = []
        if self.no_auth:
            notes.append(
                "ckptdash: WARNING --no-auth: no token is asked; every user who can reach"
                " this port (on a shared login node: every account) can save, stop and"
                " requeue the job"
            )
        if not self.loopback:
            tls = (
                "TLS is on"
                if self.certfile
                else "WARNING no TLS: the token and the page travel in clear text; add"
                " --certfile CERT.pem --keyfile KEY.pem"
            )
            auth = "; basic authentication is on" if self.basic_auth else ""
            notes.append(f"ckptdash: listening on {self.address} (--allow-remote); {tls}{auth}")
        return "\n".join(notes)


@dataclass
class RunningServer:
    """A dashboard server running in a thread (tests, benchmarks, the screenshot script).

    ``url`` is the one to open (with the token, as ``ckptdash serve`` prints it); ``base_url``
    the server's root without it.
    """

    url: str
    port: int
    thread: Any
    hub: WatcherHub
    base_url: str = ""
    token: str | None = None
    _stopped: bool = field(default=False, repr=False)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server and every watcher it started; wait for both. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self.thread.stop()
        self.thread.join(timeout)
        self.hub.close()

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_port(address: str) -> int:
    # The websocket origins name the port, so it must be known before the server starts.
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class _Plan:
    """What one server start needs: Panel's arguments and the gate in front of it."""

    kwargs: dict[str, Any]
    port: int
    access: access.Access

    def url(self, host: str) -> str:
        root = f"{'https' if self.access.secure else 'http'}://{_url_host(host)}:{self.port}/"
        token = self.access.token
        return root if token is None else f"{root}?{access.TOKEN_PARAM}={token}"


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _plan(path: Path, serve: ServeOptions, dash: DashOptions, hub: WatcherHub) -> _Plan:
    port = serve.port or _free_port(serve.address)
    factory: Callable[[], Dashboard] = lambda: Dashboard(path, options=dash, hub=hub)  # noqa: E731
    kwargs: dict[str, Any] = {
        "panels": {"/": factory},
        "port": port,
        "address": serve.address,
        "websocket_origin": serve.websocket_origins(port),
        "show": False,  # the gate wants the token: opened below with the printed URL
        "title": f"ckptdash · {path.name or path}",
        "verbose": False,
    }
    if serve.basic_auth:
        kwargs["basic_auth"] = serve.basic_auth
        kwargs["cookie_secret"] = os.environ.get("PANEL_COOKIE_SECRET") or secrets.token_hex(32)
    if serve.certfile:
        kwargs["ssl_certfile"], kwargs["ssl_keyfile"] = serve.certfile, serve.keyfile
    token = None if serve.no_auth else (serve.token or access.new_token())
    gate = access.Access(serve.hosts(), port, token=token, secure=serve.certfile is not None)
    return _Plan(kwargs, port, gate)


def _guarded_server(plan: _Plan, **extra: Any) -> Any:
    """Panel's server, bound but not yet serving, with the gate in front of every handler."""
    kwargs = dict(plan.kwargs)
    server = pn.serve(kwargs.pop("panels"), start=False, **kwargs, **extra)
    access.install(server._tornado, plan.access)
    return server


def _check_path(path: Path) -> None:
    if not path.is_dir():
        raise CkptDashError(
            f"{path}: no such directory; pass the run directory your training writes to"
            " (or a folder of runs)"
        )


def _holds_a_run(path: Path) -> bool:
    try:
        return bool(find_runs(path))
    except CkptDashError:
        return False


def serve(
    path: str | os.PathLike[str],
    serve_options: ServeOptions | None = None,
    options: DashOptions | None = None,
) -> None:
    """Serve the dashboard until interrupted (``ckptdash serve``)."""
    run = Path(path)
    _check_path(run)
    so, do = serve_options or ServeOptions(), options or DashOptions()
    key = f"ckptdash.watchers.{secrets.token_hex(4)}"  # this server's sessions share it
    hub = shared_hub(pn.state.cache, key)
    plan = _plan(run, so, do, hub)
    pn.extension("tabulator")
    try:
        server = _guarded_server(plan)  # listening from here; the gate is in place
        url = plan.url(so.address if so.loopback else socket.getfqdn())
        print(f"ckptdash: serving {run} at {url} (Ctrl-C stops)", flush=True)
        if not _holds_a_run(run):
            print(
                f"ckptdash: {run} holds no run yet; the page waits for the first event in it",
                flush=True,
            )
        if note := so.security_note():
            print(note, file=sys.stderr, flush=True)
        if so.show:
            server.io_loop.add_callback(webbrowser.open, url)
        server.start()
        server.io_loop.start()  # until Ctrl-C (Panel stops the loop on SIGINT)
    except KeyboardInterrupt:
        pass
    finally:
        hub.close()
        pn.state.cache.pop(key, None)


def start_server(
    path: str | os.PathLike[str],
    serve_options: ServeOptions | None = None,
    options: DashOptions | None = None,
    *,
    timeout: float = 30.0,
) -> RunningServer:
    """Serve the dashboard in a thread and return once it accepts connections.

    >>> with start_server("runs/exp1", ServeOptions(port=0)) as server:  # doctest: +SKIP
    ...     print(server.url)
    """
    from panel.io.threads import StoppableThread
    from tornado.ioloop import IOLoop

    run = Path(path)
    _check_path(run)
    so, do = serve_options or ServeOptions(port=0), options or DashOptions()
    hub = WatcherHub()
    plan = _plan(run, so, do, hub)
    pn.extension("tabulator")
    loop = IOLoop(make_current=False)

    def run_server() -> Any:
        # As pn.serve(threaded=True), but the gate goes in before the loop serves a request.
        server = _guarded_server(plan, loop=loop)
        server.start()
        server.io_loop.start()
        return server  # stopped by the thread once the loop ends

    thread = StoppableThread(target=run_server, io_loop=loop, owns_loop=True, daemon=True)
    thread.start()
    host = "127.0.0.1" if so.loopback or so.address in ("0.0.0.0", "::") else so.address
    server = RunningServer(
        plan.url(host), plan.port, thread, hub, plan.url(host).split("?")[0], plan.access.token
    )
    try:
        _wait_for_port(host, plan.port, timeout)
    except BaseException:
        server.stop()
        raise
    return server


def _wait_for_port(host: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pause = threading.Event()  # never set: a short, interruptible pause between attempts
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            pause.wait(0.01)
    raise CkptDashError(f"the dashboard server did not start on {host}:{port} within {timeout} s")
