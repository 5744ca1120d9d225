"""Open the notebook widget's comms while the kernel's main thread is busy (Run All).

A Panel widget in a notebook talks over two comms. Both come to life only when
the front end opens the widget's *client* comm: that ``comm_open`` message is
the signal on which Panel opens the comm it pushes updates through. The kernel
handles ``comm_open`` on its main thread, in the order of the shell channel.

Run → Run All Cells sends every cell's ``execute_request`` at once, so the
front end's ``comm_open`` (sent when it renders the widget's output) queues
behind the next cell: a training cell. Until that cell ends the widget's push
comm stays closed; Panel then reschedules each update on an event loop of the
follower's thread that never runs, so the update is lost for good. The widget
stays frozen at its first render ("holds no run", or the step it had), and the
parts whose updates were lost (the checkpoint table) stay wrong even after the
cell. Cell by cell (Shift+Enter) the front end's ``comm_open`` arrives while the
kernel is idle, which is why it worked there.

ipykernel ≥ 7 reads the shell channel in a thread of its own and hands each
message to the main thread or a subshell. This module puts a small filter in
front of that hand-off: a ``comm_open`` whose target is one of the widgets
ckptdash rendered is opened right there (creating a comm object and calling its
target, which is what the main thread would do later), everything else goes on
as before. It relies on ipykernel internals (``shell_stream``,
``shell_channel_thread``, ``shell_channel_thread_main``); where they are missing
nothing changes and the widget behaves as before.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from ckptdash.dash import compat

log = logging.getLogger(__name__)

_lock = threading.Lock()
_targets: set[str] = set()
_filtered: set[int] = set()  # id() of kernels whose shell stream has the filter


def open_off_main_thread(kernel: Any, targets: Iterable[str]) -> bool:
    """Open future ``comm_open`` requests for ``targets`` (client comm ids) on the kernel's
    shell-channel thread instead of its main thread; True when the kernel allows it."""
    with _lock:
        _targets.update(targets)
        if id(kernel) in _filtered:
            return True
    thread = getattr(kernel, "shell_channel_thread", None)
    stream = getattr(kernel, "shell_stream", None)
    forward = getattr(kernel, "shell_channel_thread_main", None)
    if (
        thread is None
        or stream is None
        or forward is None
        or getattr(kernel, "comm_manager", None) is None
        or not compat.kernel_runs_subshells(kernel)
    ):
        return False
    receive = _filter(kernel, forward)
    # The stream belongs to the shell-channel thread's event loop: swap its reader there.
    thread.io_loop.add_callback(lambda: stream.on_recv(receive, copy=False))
    with _lock:
        _filtered.add(id(kernel))
    return True


def _filter(kernel: Any, forward: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Any]:
    async def receive(msg: Any) -> None:
        if not _opened_here(kernel, msg):
            await forward(msg)

    return receive


def _opened_here(kernel: Any, msg: Any) -> bool:
    """Open the comm if ``msg`` is a ``comm_open`` for one of our targets; else False."""
    try:
        session = kernel.session
        idents, frames = session.feed_identities(msg, copy=False)
        # The header only, as ipykernel's own router reads it (the signature is checked).
        parsed = session.deserialize(frames, content=False, copy=False)
        if parsed["header"].get("msg_type") != "comm_open":
            return False
        content = session.unpack(parsed["content"])
        with _lock:
            ours = content.get("target_name") in _targets
        if not ours:
            return False
        kernel.comm_manager.comm_open(kernel.shell_stream, idents, {**parsed, "content": content})
        return True
    except Exception:  # never lose a message: the main thread handles it as before
        log.info("ckptdash: comm_open left to the kernel's main thread", exc_info=True)
        return False
