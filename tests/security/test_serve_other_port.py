"""The serve credential reaches no other local port (issue 22, point 5), in a real chromium.

Browsers send a host's cookies to all of its ports. Another account on the login node serves
a page on 127.0.0.1:OTHERPORT and gets the owner to open it once: the requests their server
receives must not carry the dashboard's token cookie (it would let them press Stop).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from ckptdash._dev.testing import FakeTrainer, ServeProcess, launch_chromium, require_chromium

# Another process: answers every GET with a small page and appends its headers to a file.
_OTHER = r"""
import http.server, json, sys
log = sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(log, "a") as f:
            f.write(json.dumps({"path": self.path, "headers": dict(self.headers)}) + "\n")
        body = b"<html><title>other</title><body>someone else's page</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = launch_chromium(p)
        yield b
        b.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_page_on_another_port_never_receives_the_token_cookie(
    browser: Any, tmp_path: Path, wait_until: Any
) -> None:
    """The owner opens the printed URL (the page loads, the cookie is set), then a page that
    another process serves on another port of 127.0.0.1, at / and at a path of its choice:
    none of the requests that server got carries the ckptdash cookie, because the cookie's
    Path is the dashboard's secret prefix."""
    run = tmp_path / "exp1"
    with FakeTrainer(run) as trainer:
        trainer.start(max_steps=10)
    port = _free_port()
    log = tmp_path / "other.jsonl"
    other = subprocess.Popen([sys.executable, "-c", _OTHER, str(port), str(log)])
    try:
        with ServeProcess(run) as server:
            context = browser.new_context()
            try:
                page = context.new_page()
                page.goto(server.url)
                wait_until(lambda: page.title().startswith("ckptdash"), timeout=60, what="the page")
                cookies = [c for c in context.cookies() if c["name"].startswith("ckptdash")]
                assert len(cookies) == 1, "the owner's browser holds the token cookie"
                prefix = urlsplit(server.url).path.rstrip("/")
                for path in ("/", "/static/js/bokeh.min.js", "/ws"):
                    wait_until(
                        lambda path=path: _opened(page, f"http://127.0.0.1:{port}{path}"),
                        timeout=30,
                        what=f"the other server's {path}",
                    )
            finally:
                context.close()
    finally:
        other.terminate()
        other.wait(10)
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    assert {r["path"] for r in seen} >= {"/", "/static/js/bokeh.min.js", "/ws"}
    for r in seen:
        cookie = {k.lower(): v for k, v in r["headers"].items()}.get("cookie", "")
        assert "ckptdash-token" not in cookie, r
    assert prefix.startswith("/ck-")
    assert cookies[0]["path"] == prefix


def _opened(page: Any, url: str) -> bool:
    from playwright.sync_api import Error

    try:
        return page.goto(url) is not None
    except Error:  # the other server is still starting
        return False
