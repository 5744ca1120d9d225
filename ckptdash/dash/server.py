"""Serving the dashboard: ``ckptdash serve`` (:func:`serve`) and a server in a thread for tests,
benchmarks and the demo (:func:`start_server`).

Every server has the gate of :mod:`ckptdash.dash.access` in front of every handler: the URL's
token, the allowed ``Host`` names, the websocket's origins. Each browser session gets its own
:class:`~ckptdash.dash.app.Dashboard`; the sessions of one server share its followers.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import secrets
import socket
import sys
import threading
import time
import webbrowser
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import panel as pn

from ckptdash.dash import access, compat
from ckptdash.dash.app import Dashboard, DashOptions
from ckptdash.dash.feed.hub import FollowerHub, shared_hub
from ckptdash.dash.server_messages import port_in_use
from ckptdash.errors import CkptDashError
from ckptdash.rundir import find_runs

DEFAULT_PORT: Final = 5006


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
    the app's root (under ``prefix``) without it.
    """

    url: str
    port: int
    thread: Any
    hub: FollowerHub
    base_url: str = ""
    token: str | None = None
    prefix: str = ""
    """The secret path the app is served under ("" with ``--no-auth``): ``/ck-…``."""
    _stopped: bool = field(default=False, repr=False)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server and every follower it started; wait for both. Idempotent."""
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
        root = f"{'https' if self.access.secure else 'http'}://{_url_host(host)}:{self.port}"
        root += self.access.prefix + "/"
        token = self.access.token
        return root if token is None else f"{root}?{access.TOKEN_PARAM}={token}"

    def tunnel(self) -> str:
        """The line to print for reaching a loopback server from a laptop through SSH."""
        return (
            f"ckptdash: from another machine: ssh -N -L {self.port}:127.0.0.1:{self.port}"
            f" {socket.getfqdn()}, then open {self.url('127.0.0.1')}"
        )


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _plan(path: Path, serve: ServeOptions, dash: DashOptions, hub: FollowerHub) -> _Plan:
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
    if gate.prefix:
        kwargs["prefix"] = gate.prefix  # the cookie is scoped to it (see access.url_prefix)
    return _Plan(kwargs, port, gate)


def _guarded_server(plan: _Plan, **extra: Any) -> Any:
    """Panel's server, bound but not yet serving, with the gate in front of every handler."""
    kwargs = dict(plan.kwargs)
    server = pn.serve(kwargs.pop("panels"), start=False, **kwargs, **extra)
    access.install(compat.tornado_app(server), plan.access)
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
    key = f"ckptdash.followers.{secrets.token_hex(4)}"  # this server's sessions share it
    hub = shared_hub(pn.state.cache, key)
    plan = _plan(run, so, do, hub)
    pn.extension("tabulator")
    try:
        try:
            server = _guarded_server(plan)  # listening from here; the gate is in place
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            raise CkptDashError(port_in_use(so.address, plan.port)) from None
        url = plan.url(so.address if so.loopback else socket.getfqdn())
        # Said before the address, which callers (a script, a wrapper) wait for: a warning
        # printed after it might not be read yet when they go on. The address stays the first
        # line of stdout for a run (the SSH line follows it).
        if not _holds_a_run(run):
            print(
                f"ckptdash: {run} holds no run yet; the page waits for the first event in it",
                flush=True,
            )
        if note := so.security_note():
            print(note, file=sys.stderr, flush=True)
        print(f"ckptdash: serving {run} at {url} (Ctrl-C stops)", flush=True)
        if so.loopback:
            print(plan.tunnel(), flush=True)
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
    from tornado.ioloop import IOLoop

    StoppableThread = compat.stoppable_thread()

    run = Path(path)
    _check_path(run)
    so, do = serve_options or ServeOptions(port=0), options or DashOptions()
    hub = FollowerHub()
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
        plan.url(host),
        plan.port,
        thread,
        hub,
        plan.url(host).split("?")[0],
        plan.access.token,
        plan.access.prefix,
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
