"""One job per run directory: refuse to start where another job is still writing.

Two jobs on one run directory — tasks of a job array sharing ``run_dir``, a job
resubmitted while the first still runs, two experiments pointed at one folder —
would mix their events into one history, and one would resume the other's
checkpoint (the resume rule takes the newest valid checkpoint, whoever wrote
it: the Lightning race). So :class:`RunGuard`, created by ``Session.start``,
refuses to run beside another live job:

1. Before this attempt writes anything, rank 0 replays the log. An attempt
   that never recorded its end (``run_finished``/``run_failed``) is *live*
   unless it is

   - this process (an earlier session of it),
   - this job's own predecessor: same scheduler and job id, lower attempt
     (a scheduler runs one instance of a job at a time),
   - on this host, and its process is gone (exited, a zombie, or the pid now
     belongs to a process started after that attempt),
   - on another host, and its last event is older than
     ``TrainConfig.stale_after_s`` (default 10 min).

   Seeing a live one, every rank gets a refusal naming both jobs and the fix;
   ``Session.start`` raises :class:`~ckptdash.errors.RunDirError` with it, and
   the refused job leaves nothing in the log.
2. After ``run_started`` is durable, rank 0 reads what is new: a job that
   started at the same moment is now visible too. Of two live jobs the one
   that started later (event time, then host and pid) gives way: ``Session.start``
   records ``run_failed`` with the reason and raises. This needs the hosts' clocks to
   agree to better than the few milliseconds between the two reads (NTP does).

The :class:`~ckptdash.train.starting.logview.LogView` it replays is handed on to
:func:`ckptdash.train.starting.recovery.recover`, which settles what crashed attempts
left behind — only once the guard has established that nobody else is writing.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Final, NoReturn

from ckptdash.errors import RunDirError
from ckptdash.events import Event, RunFailed, RunStarted
from ckptdash.rundir import RunDir
from ckptdash.rundir.process import process_alive
from ckptdash.rundir.writer import EventWriter
from ckptdash.state.records import AttemptInfo
from ckptdash.train.engine import dist
from ckptdash.train.starting.logview import LogView

_ENDED: Final = frozenset({"finished", "stopped", "failed"})


@dataclass(frozen=True)
class Claimant:
    """The attempt that wants the run directory: who it is, and what the guard may assume."""

    run: RunDir
    rank: int
    host: str
    pid: int
    job_id: str | None
    scheduler: str
    attempt: int
    stale_after_s: float
    """``TrainConfig.stale_after_s``: how long another host's silent attempt counts as live."""


class RunGuard:
    """Answers whether another live job uses the run directory; see the module docstring.

    Construct it on every rank before ``run_started`` is written: rank 0 takes the first
    look, every rank gets the answer as :attr:`refusal`. Then call :meth:`confirm` with the
    written ``run_started`` event (``None`` on other ranks). A refusal is a message naming
    both jobs and the fix; the caller refuses to start with it. ``view`` is rank 0's replay
    of the log, for :func:`~ckptdash.train.starting.recovery.recover`.
    """

    def __init__(self, me: Claimant) -> None:
        self.me = me
        self.view: LogView | None = None
        refusal = None
        if me.rank == 0:
            self.view = LogView.load(me.run)
            refusal = self._refusal(mine=None)
        self.refusal: str | None = dist.broadcast_object(refusal)

    def confirm(self, started: Event | None) -> str | None:
        """After ``run_started``: the refusal if a live job started before this one, else None."""
        refusal = None
        if self.me.rank == 0:
            assert self.view is not None and isinstance(started, RunStarted)
            self.view.update()
            refusal = self._refusal(mine=started)
        return dist.broadcast_object(refusal)

    # --- internals ---------------------------------------------------------------------------

    def _refusal(self, mine: RunStarted | None) -> str | None:
        assert self.view is not None
        now = time.time()
        stale = float(self.me.stale_after_s)
        for a in sorted(self.view.state.attempts.values(), key=lambda a: a.attempt):
            if not self._live(a, now, stale):
                continue
            if mine is not None and _start_key(a) > (mine.t, mine.host, mine.pid or 0):
                continue  # it started after us: it is the one that gives way
            return self._message(a, now, stale)
        return None

    def _live(self, a: AttemptInfo, now: float, stale: float) -> bool:
        me = self.me
        if a.outcome in _ENDED:
            return False
        if a.host == me.host and a.pid == me.pid:
            return False  # this process: an earlier session, or the attempt we just started
        if (
            a.job_id is not None
            and a.job_id == me.job_id
            and a.scheduler == me.scheduler
            and a.attempt < me.attempt
        ):
            return False  # our own predecessor: the scheduler runs one instance of a job
        if a.host == me.host and a.pid is not None:
            return process_alive(a.pid, a.started_at)
        last = a.last_heartbeat_t if a.last_heartbeat_t is not None else a.started_at
        return stale > 0 and last is not None and now - last < stale

    def _message(self, a: AttemptInfo, now: float, stale: float) -> str:
        me = self.me
        if a.host == me.host and a.pid is not None:
            why = f"its process {a.pid} is still running on {a.host}"
            dead = "stop that process first"
        else:
            last = a.last_heartbeat_t if a.last_heartbeat_t is not None else a.started_at
            why = f"its last event was {_ago(last, now)} ago and it never recorded its end"
            dead = (
                f"if it is dead (its node failed), start again once its last event is older"
                f" than TrainConfig.stale_after_s ({stale:g} s), or lower that setting"
            )
        return (
            f"{me.run.root} is in use by another job: {_describe(a)}; {why}."
            f" This job (job {me.job_id or '-'}, host {me.host}, pid {me.pid}, attempt"
            f" {me.attempt}) refuses to start, so that the two never mix their events or"
            " resume each other's checkpoints. Fix: give this job its own run_dir, or stop"
            f" the other job; {dead}."
        )


def _start_key(a: AttemptInfo) -> tuple[float, str, int]:
    # An attempt seen without run_started was there first.
    return (-1.0 if a.started_at is None else a.started_at, a.host, a.pid or 0)


def _describe(a: AttemptInfo) -> str:
    return (
        f"attempt {a.attempt} (job {a.job_id or '-'}, scheduler {a.scheduler or '?'},"
        f" host {a.host or '?'}, pid {a.pid if a.pid is not None else '?'})"
    )


def _ago(t: float | None, now: float) -> str:
    return "?" if t is None else f"{max(0.0, now - t):.0f} s"


def refuse_to_start(writer: EventWriter | None, message: str, *, recorded: bool) -> NoReturn:
    """Raise the refusal (``RunDirError``), recording it as ``run_failed`` if ``run_started``
    was already written (``recorded``); otherwise an event file left empty is removed, so a
    refused attempt leaves no trace."""
    if writer is not None:
        if recorded:
            writer.emit(RunFailed, error=f"refused to start: {message}")
        writer.close()
        if not recorded:
            with contextlib.suppress(OSError):
                if os.stat(writer.path).st_size == 0:
                    os.unlink(writer.path)
    raise RunDirError(message)
