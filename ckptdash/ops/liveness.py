"""Whether a running attempt's process is still there: the one fact only its own host knows.

A job killed with ``kill -9`` (or the OOM killer) writes nothing more: by its log alone it
looks like it runs until its pulses are missed for minutes. On the host it ran on, its
recorded pid answers at once: :func:`gone_here` finds the attempts that say ``running`` but
whose process is gone from this host (exited, a zombie, or the pid now belongs to a process
started after the attempt: pid reuse). ``ckptdash status`` then shows them ``lost`` and
``ckptdash health`` / ``watch`` raise the ``lost`` alert; on any other host they are judged
by their pulses, as before (``stale``, ``hung``).
"""

from __future__ import annotations

import socket
import time

from ckptdash.rundir.process import process_alive
from ckptdash.state import RunState


def gone_here(state: RunState, host: str | None = None, now: float | None = None) -> dict[int, str]:
    """Running attempts (the newest one) recorded on ``host`` (default: this one) whose
    process is gone, with a line saying so. Empty elsewhere, or when the pid is unknown."""
    if not state.attempts:
        return {}
    a = state.attempts[max(state.attempts)]
    host = socket.gethostname() if host is None else host
    if a.outcome != "running" or a.pid is None or not a.host or a.host != host:
        return {}
    if process_alive(a.pid, a.started_at):
        return {}
    now = time.time() if now is None else now
    seen = a.last_heartbeat_t
    ago = f"; its last event was {max(0.0, now - seen):.0f} s ago" if seen is not None else ""
    return {
        a.attempt: f"attempt {a.attempt}'s process {a.pid} is gone from {a.host} without"
        f" recording its end (killed, e.g. kill -9 or out of memory){ago}"
    }
