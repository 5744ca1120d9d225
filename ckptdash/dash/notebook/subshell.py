"""Let the notebook widget's buttons act while another cell blocks the kernel.

A click on the widget is a comm message, and a kernel handles comm messages on
its main thread: the one that runs ``trainer.fit()``. So without help a click on
*Save now* waits for the training cell to end. ipykernel 7 runs *subshells*
(Jupyter's JEP 91): more shell threads, each with its own queue. This module
asks the kernel for one subshell (a ``create_subshell_request`` on the
kernel's own control channel, as a front end sends it) and routes the messages
of the widget's comms to it, where they are handled while the main thread
trains. The routing uses ipykernel's per-comm reply route, which is not a public API
(:func:`ckptdash.dash.compat.route_to_subshell`): where it or subshells are
missing, nothing changes and clicks wait as before.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from ckptdash.dash import compat

log = logging.getLogger(__name__)


class SubshellRoute:
    """Routes the comms of rendered Panel views to one subshell of this kernel."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subshell: str | None = None
        self._tried = False
        self._routed: set[str] = set()

    def route(self, client_comms: Iterable[Any], lock: threading.RLock) -> int:
        """Route every opened comm among ``client_comms`` (pyviz_comms client comms) not yet
        routed, its messages handled under ``lock`` (the lock the widget's updates hold: the
        subshell's thread and the follower's never change the widgets at once); returns how
        many comms are routed so far. Cheap when there is nothing new."""
        new = [
            c
            for c in client_comms
            if compat.kernel_comm(c) is not None
            and getattr(compat.kernel_comm(c), "comm_id", None) not in self._routed
            and compat.can_route(compat.kernel_comm(c))  # else an ipykernel without routes
        ]
        if not new:
            return len(self._routed)
        subshell = self._subshell_id()
        if subshell is None:
            return 0
        with self._lock:
            for client in new:
                compat.route_to_subshell(client, subshell, lambda h: _holding(lock, h))
                self._routed.add(compat.kernel_comm(client).comm_id)
        return len(self._routed)

    def _subshell_id(self) -> str | None:
        with self._lock:
            if not self._tried:
                self._tried = True
                self._subshell = _create_subshell()
            return self._subshell


def _holding(lock: threading.RLock, handler: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def handle(msg: Any) -> Any:
        with lock:
            return handler(msg)

    return handle


def _create_subshell() -> str | None:
    """A new subshell of the kernel this code runs in, or None where there is none to have."""
    kernel = current_kernel()
    if kernel is None or not compat.kernel_runs_subshells(kernel):
        return None
    try:
        from ipykernel import get_connection_file
        from jupyter_client.blocking.client import BlockingKernelClient

        client = BlockingKernelClient(connection_file=get_connection_file())
        client.load_connection_file()
        channel = client.control_channel
        channel.start()
        try:
            msg = client.session.msg("create_subshell_request", {})
            channel.send(msg)
            while True:
                reply = channel.get_msg(timeout=10)
                if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                    break
        finally:
            channel.stop()
            client.stop_channels()
    except Exception:  # no subshell: clicks wait for the main thread, as without ckptdash
        log.info("ckptdash: no kernel subshell for the widget's clicks", exc_info=True)
        return None
    content = reply.get("content", {})
    subshell = content.get("subshell_id")
    return str(subshell) if content.get("status") == "ok" and subshell else None


def current_kernel() -> Any | None:
    """The IPython kernel this code runs in, or None outside one."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    shell = get() if get is not None else None
    return getattr(shell, "kernel", None)
