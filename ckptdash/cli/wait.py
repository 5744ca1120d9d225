"""``ckptdash save|stop --wait``: wait for the job's answer to a command and say it.

The answer comes back through the run's log as ``command_applied``, ``command_rejected`` or
``command_expired`` (docs/format.md); this module polls the replayed state for it. Plain
Python, no Panel: the CLI's controls import it.
"""

from __future__ import annotations

import threading
import time
from typing import Final

from ckptdash import humanize
from ckptdash.rundir import RunDir
from ckptdash.state.reading import load_state
from ckptdash.state.records import CommandInfo

ANSWERED: Final = frozenset({"applied", "rejected", "expired"})
POLL_S: Final = 0.2
"""How often the log is read again while waiting (a replay of a small run takes ms)."""


def wait_for_answer(run: RunDir, command_id: str, timeout_s: float) -> CommandInfo | None:
    """The command's record once the job has answered it, or None after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()  # never set: an interruptible pause (Ctrl-C ends the wait)
    while True:
        info = load_state(run).commands.get(command_id)
        if info is not None and info.status in ANSWERED:
            return info
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        pause.wait(min(POLL_S, left))


def describe_answer(label: str, info: CommandInfo, run: RunDir) -> str:
    """One line: ``save_now 3f2a91c0 applied by attempt 1: checkpoints/step=301-manual.ckpt``."""
    who = f" by attempt {info.attempt}" if info.attempt is not None else ""
    head = f"{label} {humanize.short_id(info.id)} {info.status}{who}"
    if info.status == "applied":
        return head + (f": {_relative(info.detail, run)}" if info.detail else "")
    return head + f": {info.reason or 'no reason given'}"


def _relative(path: str, run: RunDir) -> str:
    for root in (run.root.resolve(), run.root):
        prefix = f"{root}/"
        if path.startswith(prefix):
            return path[len(prefix) :]
    return path
