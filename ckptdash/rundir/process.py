"""Whether a process a run directory names (a lock holder, a running attempt) still runs on
this host: the training side's guard and recovery and the login side's liveness share it."""

from __future__ import annotations

import os
from pathlib import Path


def process_alive(pid: int, started_before: float | None = None) -> bool:
    """Whether process ``pid`` of this host is running (and, where Linux tells us, was
    already running at ``started_before``: a later process with the same pid is another one).

    A zombie (exited, not yet reaped by its parent) counts as gone.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists and belongs to someone else
    except OSError:
        return True  # cannot tell: assume it runs (the safe side)
    info = _proc_stat(pid)
    if info is None:
        return True
    state, started = info
    if state == "Z":
        return False
    # Generous slack: /proc's boot time has whole seconds, and a clock stepped forward
    # since would make a live process look younger. Erring here only refuses a job.
    return not (
        started_before is not None and started is not None and started > started_before + 60
    )


def _proc_stat(pid: int) -> tuple[str, float | None] | None:
    """Linux: the process state letter and its start time (Unix seconds), or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
        fields = raw[raw.rindex(")") + 2 :].split()
        state, ticks = fields[0], int(fields[19])
    except (OSError, ValueError, IndexError):
        return None
    try:
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        return state, boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration):
        return state, None
