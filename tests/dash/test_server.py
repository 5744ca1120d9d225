"""The served dashboard: pages, sessions sharing one follower, origins, safe defaults, and
`panel serve ckptdash` from the repository root."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import panel as pn
import pytest
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.ioloop import IOLoop
from tornado.websocket import websocket_connect

from ckptdash.cli import main
from ckptdash.dash.app import Dashboard, DashOptions, default_path
from ckptdash.dash.feed.hub import FollowerHub
from ckptdash.dash.server import ServeOptions, start_server
from ckptdash.errors import CkptDashError

WaitUntil = Callable[..., None]
REPO = Path(__file__).resolve().parents[2]
# A script or stylesheet from anywhere but this server (a CDN) would break offline login nodes.
EXTERNAL = re.compile(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//(?!127\.0\.0\.1|localhost)""")


@dataclass
class Served:
    url: str
    hub: FollowerHub
    dashboards: list[Dashboard]


UNUSED_SESSION_MS = 20_000
"""How long a page load's session lives with no browser connected. Two loads must overlap for
the follower to be shared: at 0.3 s a CI run's second load came after the first session had
ended (a test with a 0.3 s window). The price is the wait for both sessions to end."""


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        return str(response.read().decode())


@pytest.fixture
def served(
    make_run: Callable[..., Path], wait_until: WaitUntil, hub: FollowerHub
) -> Iterator[Served]:
    """The Dashboard served with pn.serve(port=0, threaded=True); sessions nobody connects to
    are destroyed after UNUSED_SESSION_MS (so session ends can be watched)."""
    root = make_run()
    dashboards: list[Dashboard] = []

    def app() -> Dashboard:
        d = Dashboard(root, options=DashOptions(watch="inotify"), hub=hub)
        dashboards.append(d)
        return d

    thread = pn.serve(
        {"/": app},
        port=0,
        threaded=True,
        show=False,
        verbose=False,
        check_unused_sessions_milliseconds=100,
        unused_session_lifetime_milliseconds=UNUSED_SESSION_MS,
    )
    # pn.serve(port=0) picks the port inside its thread; Panel records the server by id.
    wait_until(lambda: thread.server_id in pn.state._servers, what="the server to start")
    port = pn.state._servers[thread.server_id][0].port
    try:
        yield Served(f"http://localhost:{port}/", hub, dashboards)
    finally:
        thread.stop()
        thread.join(10)


def test_page_is_served_without_any_external_resource(served: Served) -> None:
    """A page load makes a session showing the run, and the page loads nothing from another
    host (no CDN)."""
    html = _get(served.url)
    (dashboard,) = served.dashboards
    assert dashboard.path.name == "exp1"
    assert not EXTERNAL.findall(html), EXTERNAL.findall(html)[:3]


def test_sessions_share_one_follower_stopped_with_the_last_session(
    served: Served, wait_until: WaitUntil
) -> None:
    """Each page load is a session with its own Dashboard; all share one follower, which stops
    when the last session ends."""
    _get(served.url)
    _get(served.url)
    first, second = served.dashboards
    assert first is not second
    assert first.follower is second.follower
    assert first.table.table is not second.table.table  # widgets per session
    follower = first.follower
    wait_until(lambda: served.hub.users(follower) == 0, timeout=90, what="both sessions to end")
    wait_until(lambda: not follower.running, what="the follower to stop")


def test_listening_beyond_this_host_needs_an_explicit_flag() -> None:
    """A non-loopback address is refused with the safe alternatives; with --allow-remote the
    security note says whether TLS is on and how to turn it on."""
    with pytest.raises(CkptDashError, match="SSH tunnel"):
        ServeOptions(address="0.0.0.0")
    opened = ServeOptions(address="0.0.0.0", allow_remote=True)
    assert "--certfile" in opened.security_note()
    assert (
        "basic authentication is on"
        in ServeOptions(address="0.0.0.0", allow_remote=True, basic_auth="secret").security_note()
    )
    assert ServeOptions().security_note() == ""
    assert ServeOptions().websocket_origins(8123) == ["localhost:8123", "127.0.0.1:8123"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "{run}", "--address", "0.0.0.0"], "--allow-remote"),
        (["serve", "{tmp}/missing"], "no such directory"),
        (["serve", "{run}", "--poll", "--inotify"], "choose one"),
    ],
)
def test_cli_serve_refuses_bad_input(
    make_run: Callable[..., Path],
    tmp_path: Path,
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`ckptdash serve` with a wide address, a missing folder or two watch modes: one line,
    exit 2, no server."""
    run = make_run()
    assert main([a.format(run=run, tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def _ws_status(url: str, origin: str) -> int | None:
    """HTTP status of a websocket upgrade from a page at ``origin`` (None: it was accepted)."""

    async def attempt() -> int | None:
        request = HTTPRequest(url, headers={"Origin": origin})
        try:
            conn = await websocket_connect(request)
        except HTTPClientError as exc:
            return exc.code
        conn.close()
        return None

    return IOLoop(make_current=False).run_sync(attempt, timeout=30)


def test_websocket_accepts_only_the_served_origins(
    make_run: Callable[..., Path],
) -> None:
    """A page from another origin cannot open the dashboard's websocket (so cannot click its
    buttons); the served address can."""
    with start_server(make_run(), ServeOptions(port=0)) as server:
        ws = f"ws://127.0.0.1:{server.port}{server.prefix}/ws?token={server.token}"
        assert _ws_status(ws, "http://evil.example") == 403
        assert _ws_status(ws, f"http://localhost:{server.port}") != 403
        assert _ws_status(ws, f"http://127.0.0.1:{server.port}") != 403


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _poll_page(url: str, proc: subprocess.Popen[str], timeout: float = 60.0) -> str:
    """The page once the server answers (condition-based: retry until then, or fail)."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()  # never set: a short, interruptible pause between attempts
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"the server exited ({proc.returncode}): {out}")
        try:
            return _get(url)
        except OSError:
            pause.wait(0.05)  # still starting
    pytest.fail(f"{url} did not answer within {timeout} s")


def test_default_path_is_the_environment_variable_else_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bare `panel serve ckptdash` shows $CKPTDASH_RUN_DIR, else ./runs."""
    monkeypatch.delenv("CKPTDASH_RUN_DIR", raising=False)
    assert default_path() == "runs"
    monkeypatch.setenv("CKPTDASH_RUN_DIR", "/scratch/me/runs")
    assert default_path() == "/scratch/me/runs"


def test_panel_serve_of_the_package_folder(make_run: Callable[..., Path]) -> None:
    """`panel serve ckptdash --args RUN_DIR` from the repository root serves the run."""
    run = make_run()
    port = _free_port()
    cmd = [sys.executable, "-m", "panel", "serve", "ckptdash", "--port", str(port)]
    cmd += ["--args", str(run)]
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        html = _poll_page(f"http://localhost:{port}/", proc)
        assert f"<title>ckptdash · {run}</title>" in html
    finally:
        proc.terminate()
        proc.wait(30)


def test_basic_auth_asks_for_a_login(make_run: Callable[..., Path]) -> None:
    """With --basic-auth the dashboard is behind Panel's login page."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    with start_server(make_run(), ServeOptions(port=0, basic_auth="s3cret-pass")) as server:
        request = urllib.request.Request(
            server.base_url, headers={"Authorization": f"token {server.token}"}
        )
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.build_opener(NoRedirect).open(request, timeout=30)
        assert answer.value.code == 302
        assert "login" in answer.value.headers["Location"]
