"""No scheduler: a run started by hand, in a notebook, or by a launcher ckptdash cannot ask.

Nothing to requeue; attempts are counted in the run directory unless ``CKPTDASH_ATTEMPT``
says the number (a controller that counts restarts, see docs/launchers.md). This is also what
a Kubernetes pod or a cloud spot VM is to ckptdash: its SIGTERM, sent a grace period before
the kill, is the default ``terminate`` signal (save, stop), and the controller restarts it.
"""

from __future__ import annotations

from ckptdash.schedulers.base import Scheduler


class LocalScheduler(Scheduler):
    """No scheduler (the base behaviour, under its own name)."""

    name = "local"
