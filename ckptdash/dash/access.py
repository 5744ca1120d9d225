"""Who may use a served dashboard: the holder of its secret token, through a Host name it expects.

Binding 127.0.0.1 keeps other machines out but not the other accounts of a shared login node,
and a page from any web site can reach 127.0.0.1 through a DNS name it rebinds there. So every
request — page, script, websocket — passes one gate, at the tornado level, before any handler:

1. its ``Host`` header must name this server (``localhost``, ``127.0.0.1``, ``::1``, the bind
   address, or a name given with ``--allow-host``); anything else gets 403 (DNS rebinding);
2. it must carry the token: in the URL ``ckptdash serve`` prints (``?token=...``, swapped at
   once for an HttpOnly, SameSite=Strict cookie and a redirect to the clean URL, as Jupyter
   does), in that cookie, or in an ``Authorization: token ...`` header; anything else gets 401.

Browsers send a host's cookies to every port of it, so a cookie scoped to ``/`` would also
reach a page that another account serves on ``127.0.0.1:OTHERPORT``, once the owner opens it.
So the app lives under a secret path (:func:`url_prefix`, derived from the token: a stable
token gives a stable URL) and the cookie's ``Path`` is that prefix: the browser sends it to
no other path, on any port, and only the token's holder knows the path.

``--no-auth`` drops step 2 (not step 1). Secrets are never taken from the command line, where
every user of the machine reads them in ``/proc/PID/cmdline``: they come from a file only its
owner can read, or from an environment variable.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode

from tornado import httputil, web

from ckptdash.errors import CkptDashError

TOKEN_ENV: Final = "CKPTDASH_TOKEN"
"""The token to require, instead of a new random one at each start (a stable URL)."""
BASIC_AUTH_ENV: Final = "CKPTDASH_BASIC_AUTH"
"""A password for Panel's login page (the same as ``--basic-auth FILE``)."""
LOOPBACK_NAMES: Final = ("localhost", "127.0.0.1", "::1")
TOKEN_PARAM: Final = "token"


def url_prefix(token: str | None) -> str:
    """The secret path the app is served under (``/ck-`` and 32 hex digits), "" without a token.

    A one-way function of the token, so the URL stays the same with ``--token-file``, and the
    path (visible in the cookie's attributes, the history) tells nothing about the token.
    """
    if token is None:
        return ""
    return "/ck-" + hashlib.sha256(b"ckptdash url prefix\0" + token.encode()).hexdigest()[:32]


def new_token() -> str:
    """A fresh random token (192 bits, URL-safe)."""
    return secrets.token_urlsafe(24)


def read_secret_file(path: str | os.PathLike[str], what: str) -> str:
    """The secret in ``path`` (surrounding whitespace removed), refused unless only its owner
    can read it.

    ``what`` names the option in messages (``--token-file``).
    """
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise CkptDashError(f"{what} {p}: cannot read it ({exc.strerror})") from None
    with os.fdopen(fd, encoding="utf-8") as f:
        mode = os.fstat(f.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise CkptDashError(f"{what} {p}: not a regular file; put the secret in a file")
        if mode & 0o077:
            raise CkptDashError(
                f"{what} {p}: other users can read it (mode {stat.S_IMODE(mode):04o});"
                f" run chmod 600 {p}"
            )
        value = f.read().strip()
    if not value:
        raise CkptDashError(f"{what} {p}: the file is empty; write the secret into it")
    return value


def basic_auth_secret(text: str) -> str | dict[str, str]:
    """What Panel's basic authentication takes from a secret: a JSON object of
    ``{"user": "password"}``, or else one password for any user name."""
    if text.startswith("{"):
        try:
            users = json.loads(text)
        except ValueError:
            return text
        if isinstance(users, dict) and all(isinstance(v, str) for v in users.values()):
            return {str(k): v for k, v in users.items()}
    return text


def allowed_hosts(
    address: str, names: Iterable[str], *, wildcard_names: Iterable[str]
) -> tuple[str, ...]:
    """Host names the dashboard answers to: the loopback names, the bind address (or, bound to
    every interface, ``wildcard_names``: this machine's names), and ``names``."""
    hosts = [*LOOPBACK_NAMES]
    if address in ("0.0.0.0", "::"):
        hosts += list(wildcard_names)
    else:
        hosts.append(address)
    hosts += list(names)
    return tuple(dict.fromkeys(h.strip("[]").lower() for h in hosts if h))


@dataclass(frozen=True)
class Access:
    """The gate's rules for one server. ``token=None``: no token needed (``--no-auth``)."""

    hosts: tuple[str, ...]
    port: int
    token: str | None = None
    secure: bool = False

    @property
    def prefix(self) -> str:
        """The path the app is served under; the cookie's ``Path`` (see :func:`url_prefix`)."""
        return url_prefix(self.token)

    @property
    def cookie(self) -> str:
        # Cookies do not keep ports apart: two dashboards on one host need two names.
        return f"ckptdash-token-{self.port}"

    def _is_token(self, value: str | None) -> bool:
        return (
            value is not None
            and self.token is not None
            and hmac.compare_digest(value.encode(), self.token.encode())
        )

    def host_allowed(self, host_header: str) -> bool:
        """Whether a ``Host`` header (``name:port``, ``[::1]:port``) names this server."""
        host, _ = httputil.split_host_and_port(host_header.lower())
        return host.strip("[]") in self.hosts

    def verdict(self, request: httputil.HTTPServerRequest) -> Verdict | None:
        """None to let the request through; else what to answer instead."""
        if not self.host_allowed(request.host or ""):
            return Verdict(
                403,
                f"ckptdash: Host {request.host!r} is not one this dashboard"
                " answers to; add it with --allow-host NAME if it is yours",
            )
        if self.token is None:
            return None
        given = request.query_arguments.get(TOKEN_PARAM)
        if given and self._is_token(given[-1].decode(errors="replace")):
            if request.headers.get("Upgrade", "").lower() == "websocket":
                return None
            return Verdict(302, "", redirect=_without_token(request, self.prefix), set_cookie=True)
        header = request.headers.get("Authorization", "")
        if header.lower().startswith("token ") and self._is_token(header[6:].strip()):
            return None
        if self._is_token(_cookie(request, self.cookie)):
            return None
        return Verdict(
            401,
            "ckptdash: this dashboard needs its token; open the URL that"
            " `ckptdash serve` printed (it ends in ?token=...)",
        )


@dataclass(frozen=True)
class Verdict:
    """An answer given instead of the page: a refusal, or the token's swap for a cookie."""

    status: int
    message: str
    redirect: str = ""
    set_cookie: bool = False


def _cookie(request: httputil.HTTPServerRequest, name: str) -> str | None:
    morsel = request.cookies.get(name)
    return None if morsel is None else morsel.value


def _without_token(request: httputil.HTTPServerRequest, prefix: str) -> str:
    pairs = parse_qsl(request.query, keep_blank_values=True)
    query = [(k, v) for k, v in pairs if k != TOKEN_PARAM]
    # "//evil.example" would be a redirect to another site: keep the path on this one.
    path = "/" + request.path.lstrip("/")
    if prefix and path != prefix and not path.startswith(prefix + "/"):
        path = prefix + "/"  # an old bookmark (/?token=...): the app lives under the prefix
    return path + (f"?{urlencode(query)}" if query else "")


class _Gate(web.RequestHandler):
    """Answers a request the gate stopped (any method, websocket upgrades included)."""

    def initialize(self, access: Access, verdict: Verdict) -> None:
        self.access, self.verdict = access, verdict

    def prepare(self) -> None:
        v = self.verdict
        if v.set_cookie and self.access.token is not None:
            self.set_cookie(
                self.access.cookie,
                self.access.token,
                httponly=True,
                samesite="Strict",
                secure=self.access.secure,
                path=self.access.prefix or "/",  # no other path, on any port, receives it
            )
        self.set_header("Cache-Control", "no-store")
        if v.redirect:
            self.redirect(v.redirect, status=v.status)
            return
        self.set_status(v.status)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(v.message + "\n")

    def check_xsrf_cookie(self) -> None:  # the gate's answers change nothing
        return


def install(app: web.Application, access: Access) -> None:
    """Put ``access``'s gate in front of every handler of ``app`` (call before it serves)."""
    find: Callable[..., Any] = app.find_handler

    def find_handler(request: httputil.HTTPServerRequest, **kwargs: Any) -> Any:
        verdict = access.verdict(request)
        if verdict is None:
            return find(request, **kwargs)
        return app.get_handler_delegate(request, _Gate, {"access": access, "verdict": verdict})

    app.find_handler = find_handler  # type: ignore[method-assign]


def environment_secrets(environ: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """``(token, basic_auth password)`` from the environment (``CKPTDASH_TOKEN``,
    ``CKPTDASH_BASIC_AUTH``); None where unset or empty."""
    env = os.environ if environ is None else environ
    return env.get(TOKEN_ENV) or None, env.get(BASIC_AUTH_ENV) or None


PANEL_SERVE_NO_LOGIN: Final = (
    "`panel serve` asks no login here, so anyone who can reach this port could drive the run."
    " Serve it with `ckptdash serve` (a token in the URL), or give `panel serve`"
    " --basic-auth or --oauth-provider"
)


def panel_serve_lock(config: Any, user: str | None) -> str:
    """Why a page of ``panel serve ckptdash`` may only watch ("" when it may act).

    It may act when Panel asks for a login (``config.basic_auth`` or
    ``config.oauth_provider``) and this session's user logged in. Panel's "guest" is no
    login: its cookie is not signed, any client can send it.
    """
    login = bool(getattr(config, "basic_auth", None) or getattr(config, "oauth_provider", None))
    if login and user not in (None, "", "guest"):
        return ""
    return PANEL_SERVE_NO_LOGIN
