"""Who can use a served dashboard: a real `ckptdash serve` process, asked over real HTTP and
websocket connections (stdlib and tornado clients), as another local user or a rebinding web
page would.

Pins: the token in the printed URL is swapped for an HttpOnly SameSite=Strict cookie and a
redirect to the clean URL; pages, scripts and the websocket without it get 401; a Host name
the server does not know gets 403 whatever else the request carries; --no-auth warns; secrets
come from owner-only files or the environment, never the command line; TLS is offered.
"""

from __future__ import annotations

import http.client
import os
import shutil
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.ioloop import IOLoop
from tornado.websocket import websocket_connect

from ckptdash._dev.testing import FakeTrainer, ServeProcess
from tests.conftest import WaitUntil


@dataclass
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: str


def request(
    url: str,
    *,
    host: str | None = None,
    headers: dict[str, str] | None = None,
    context: ssl.SSLContext | None = None,
) -> Answer:
    """One GET, redirects not followed; ``host`` replaces the Host header (as a rebinding
    page's browser sends its own site's name to the address the name now points at)."""
    parts = urlsplit(url)
    hostname = parts.hostname or "127.0.0.1"
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(hostname, parts.port, timeout=30, context=context)
    else:
        conn = http.client.HTTPConnection(hostname, parts.port, timeout=30)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    hdrs = dict(headers or {})
    if host is not None:
        hdrs["Host"] = host
    try:
        conn.request("GET", target or "/", headers=hdrs)
        response = conn.getresponse()
        return Answer(response.status, response.headers, response.read().decode(errors="replace"))
    finally:
        conn.close()


def ws_status(url: str, headers: dict[str, str]) -> int | None:
    """HTTP status that refused a websocket upgrade, or None when it was accepted."""

    async def attempt() -> int | None:
        try:
            conn = await websocket_connect(HTTPRequest(url, headers=headers))
        except HTTPClientError as exc:
            return exc.code
        conn.close()
        return None

    status: int | None = IOLoop(make_current=False).run_sync(attempt, timeout=30)
    return status


def owner_only(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("access") / "exp1"
    with FakeTrainer(root) as trainer:
        trainer.start(max_steps=100)
        trainer.save(1)
    return root


@pytest.fixture(scope="module")
def guarded(run: Path) -> Iterator[ServeProcess]:
    """`ckptdash serve RUN --allow-host dash.example`, with its default token."""
    with ServeProcess(run, "--allow-host", "dash.example") as server:
        yield server


def _port(server: ServeProcess) -> int:
    return int(urlsplit(server.url).port or 0)


def _prefix(server: ServeProcess) -> str:
    """The secret path the app is served under (``/ck-…``, from the printed URL)."""
    return urlsplit(server.url).path.rstrip("/")


def test_printed_url_opens_with_one_click_and_leaves_a_cookie(
    guarded: ServeProcess, wait_until: WaitUntil
) -> None:
    """The printed URL carries a token under the secret /ck-… path (and the `ssh -L` line to
    reach it is printed too); opening it sets an HttpOnly, SameSite=Strict cookie scoped to
    that path and redirects to the same page without the token, which then loads with the
    cookie."""
    assert "?token=" in guarded.url
    first = request(guarded.url)
    prefix = _prefix(guarded)
    assert prefix.startswith("/ck-")
    port = _port(guarded)
    tunnel = f"ssh -N -L {port}:127.0.0.1:{port} "
    wait_until(lambda: tunnel in guarded.log(), what="the SSH line, printed after the URL")
    assert f"then open http://127.0.0.1:{port}{prefix}/?token=" in guarded.log()
    assert first.status == 302
    assert first.headers["Location"] == f"{prefix}/"
    cookie = first.headers["Set-Cookie"]
    assert cookie.startswith(f"ckptdash-token-{_port(guarded)}=")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert f"Path={prefix};" in cookie or cookie.endswith(f"Path={prefix}")
    page = request(
        urlsplit(guarded.url)._replace(query="").geturl(), headers={"Cookie": cookie.split(";")[0]}
    )
    assert page.status == 200
    assert "<title>ckptdash · exp1</title>" in page.body
    # The redirect keeps other arguments, and never leaves this server ("//host" would).
    token = urlsplit(guarded.url).query
    base = guarded.url.split("/?")[0]
    assert request(f"{base}/?a=1&{token}").headers["Location"] == f"{prefix}/?a=1"
    root = f"http://127.0.0.1:{_port(guarded)}"
    assert request(f"{root}//evil.example/?{token}").headers["Location"] == f"{prefix}/"
    assert request(f"{root}/?{token}").headers["Location"] == f"{prefix}/"  # an old bookmark


def test_without_the_token_pages_scripts_and_websocket_are_refused(
    guarded: ServeProcess,
) -> None:
    """Another user who knows the port but not the token gets 401 for the page, Panel's
    static JavaScript, and the websocket (so no button of the dashboard can be used)."""
    port = _port(guarded)
    base = f"http://127.0.0.1:{port}{_prefix(guarded)}"
    ws = f"ws://127.0.0.1:{port}{_prefix(guarded)}/ws"
    assert request(f"{base}/").status == 401
    assert "token" in request(f"{base}/").body
    assert request(f"{base}/static/js/bokeh.min.js").status == 401
    assert request(f"{base}/?token=wrong-token-0123456789").status == 401
    wrong = {"Cookie": f"ckptdash-token-{port}=guess", "Origin": f"http://127.0.0.1:{port}"}
    assert request(f"{base}/", headers=wrong).status == 401
    assert ws_status(ws, wrong) == 401
    token = urlsplit(guarded.url).query.split("=", 1)[1]
    right = {"Cookie": f"ckptdash-token-{port}={token}", "Origin": f"http://127.0.0.1:{port}"}
    assert ws_status(ws, right) not in (401, 403)
    assert request(f"{base}/", headers={"Authorization": f"token {token}"}).status == 200


def test_host_names_outside_the_allowlist_are_refused(guarded: ServeProcess) -> None:
    """DNS rebinding: a page at evil.example whose name now points at 127.0.0.1 sends
    Host: evil.example — refused with 403 for pages and the websocket even with the token;
    the loopback names, ::1 and --allow-host names are served."""
    port = _port(guarded)
    token = urlsplit(guarded.url).query.split("=", 1)[1]
    auth = {"Authorization": f"token {token}"}
    base = f"http://127.0.0.1:{port}{_prefix(guarded)}/"
    evil = request(base, host=f"evil.example:{port}", headers=auth)
    assert evil.status == 403
    assert "--allow-host" in evil.body
    rebound = {**auth, "Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
    assert ws_status(f"ws://127.0.0.1:{port}{_prefix(guarded)}/ws", rebound) == 403
    for name in ("localhost", "127.0.0.1", "dash.example", "LOCALHOST"):
        assert request(base, host=f"{name}:{port}", headers=auth).status == 200, name
    # Past the gate (Bokeh itself then fails to build an IPv6 page for an IPv4 socket).
    assert request(base, host=f"[::1]:{port}", headers=auth).status != 403


def test_no_auth_serves_without_token_but_warns_and_still_checks_hosts(run: Path) -> None:
    """--no-auth: the printed URL has no token, the page loads without one, a warning is
    printed at start, and the Host allowlist still holds."""
    with ServeProcess(run, "--no-auth") as server:
        assert "token" not in server.url
        assert "WARNING --no-auth" in server.log()
        assert request(server.url).status == 200
        assert request(server.url, host="evil.example").status == 403


def test_secrets_come_from_owner_only_files_never_the_command_line(
    run: Path, tmp_path: Path
) -> None:
    """A token or password file other users can read is refused with `chmod 600 FILE`;
    read from 0600 files (or the environment) they never appear in /proc/PID/cmdline,
    and the password still guards Panel's login page."""
    loose = owner_only(tmp_path / "loose", "hunter2-password", 0o644)
    cmd = [sys.executable, "-m", "ckptdash", "serve", str(run), "--port", "0"]
    refused = subprocess.run(
        [*cmd, "--basic-auth", str(loose)], capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 2
    assert f"chmod 600 {loose}" in refused.stderr
    for option in ("--token-file", "--keyfile"):
        extra = ["--certfile", str(loose)] if option == "--keyfile" else []
        done = subprocess.run(
            [*cmd, option, str(loose), *extra], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2 and f"chmod 600 {loose}" in done.stderr, option
    token = "file-token-" + "x" * 24
    token_file = owner_only(tmp_path / "token", token + "\n")
    password = owner_only(tmp_path / "password", "hunter2-password\n")
    with ServeProcess(run, "--token-file", str(token_file), "--basic-auth", str(password)) as s:
        assert s.url.endswith(f"?token={token}")
        with open(f"/proc/{s.proc.pid}/cmdline", "rb") as f:
            cmdline = f.read()
        assert b"hunter2" not in cmdline and token.encode() not in cmdline
        page = request(s.url.split("?")[0], headers={"Authorization": f"token {token}"})
        assert page.status == 302 and "login" in page.headers["Location"]
    env = {**os.environ, "CKPTDASH_TOKEN": "env-token-" + "y" * 24}
    with_env = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert with_env.stdout is not None
        line = with_env.stdout.readline()
        assert line.rstrip().endswith(f"?token={env['CKPTDASH_TOKEN']} (Ctrl-C stops)"), line
    finally:
        with_env.terminate()
        with_env.wait(30)


def test_tls_is_offered_and_its_absence_is_said(run: Path, tmp_path: Path) -> None:
    """--certfile/--keyfile serve https (the printed URL says so and the token works over
    it); --allow-remote without them prints a warning that TLS is off."""
    openssl = shutil.which("openssl")
    if openssl is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but no openssl: apt-get install openssl")
        pytest.skip("no openssl to make a test certificate: apt-get install openssl")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    key.chmod(0o600)
    with ServeProcess(run, "--certfile", str(cert), "--keyfile", str(key)) as server:
        assert server.url.startswith("https://127.0.0.1:")
        context = ssl.create_default_context(cafile=str(cert))
        context.check_hostname = False
        assert request(server.url, context=context).status == 302
    with ServeProcess(run, "--address", "0.0.0.0", "--allow-remote") as server:
        assert "WARNING no TLS" in server.log()
