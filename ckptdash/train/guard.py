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

   Seeing a live one, every rank raises :class:`~ckptdash.errors.RunDirError`
   naming both jobs and the fix; the refused job leaves nothing in the log.
2. After ``run_started`` is durable, rank 0 reads what is new: a job that
   started at the same moment is now visible too. Of two live jobs the one
   that started later (event time, then host and pid) gives way: it records
   ``run_failed`` with the reason and raises. This needs the hosts' clocks to
   agree to better than the few milliseconds between the two reads (NTP does).

The :class:`LogView` it replays is handed on to
:func:`ckptdash.train.recovery.recover`, which settles what crashed attempts
left behind — only once the guard has established that nobody else is writing.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from ckptdash import events as ev_
from ckptdash.errors import RunDirError
from ckptdash.events import Event, RunFailed, RunStarted
from ckptdash.records import AttemptInfo
from ckptdash.rundir import RunDir
from ckptdash.state import RunState
from ckptdash.tail import RunTailer
from ckptdash.train import dist

if TYPE_CHECKING:
    from ckptdash.train.session import Session

_CKPT_TYPES: Final = frozenset(
    {
        ev_.CheckpointStarted,
        ev_.CheckpointSaved,
        ev_.CheckpointFailed,
        ev_.CheckpointRemoved,
        ev_.CheckpointInvalid,
    }
)
_ENDED: Final = frozenset({"finished", "stopped", "failed"})


@dataclass
class LogView:
    """The run's log as the guard and the recovery need it, kept current by one tailer.

    ``state`` is the replayed :class:`~ckptdash.state.RunState`; ``checkpoints``
    maps each checkpoint path to its latest checkpoint event (by time; on a tie
    an outcome counts as later than a start).
    """

    run: RunDir
    state: RunState
    tailer: RunTailer
    checkpoints: dict[str, Event] = field(default_factory=dict)

    @classmethod
    def load(cls, run: RunDir) -> LogView:
        view = cls(run, RunState(str(run.root), run.info().run_id, confine=True), RunTailer(run))
        for batch in view.tailer.batches():
            view._apply(batch.events)
            view.state.apply(batch)
        return view

    def update(self) -> None:
        """Read what was appended since the last look."""
        batch = self.tailer.poll()
        self._apply(batch.events)
        self.state.apply(batch)

    def _apply(self, events: list[Event]) -> None:
        latest = self.checkpoints
        for ev in events:
            if type(ev) in _CKPT_TYPES:
                path: str = ev.path  # type: ignore[attr-defined]
                old = latest.get(path)
                if old is None or _order(ev) >= _order(old):
                    latest[path] = ev


def _order(ev: Event) -> tuple[float, int]:
    return ev.t, 0 if isinstance(ev, ev_.CheckpointStarted) else 1


@dataclass(frozen=True)
class _Me:
    host: str
    pid: int
    job_id: str | None
    scheduler: str
    attempt: int


class RunGuard:
    """Refuses a run directory another live job is using; see the module docstring.

    Construct it on every rank before ``run_started`` is written (rank 0 checks,
    every rank gets the answer), then call :meth:`confirm` with the written
    ``run_started`` event (``None`` on other ranks). ``view`` is rank 0's
    replay of the log, for :func:`~ckptdash.train.recovery.recover`.
    """

    def __init__(self, session: Session) -> None:
        self.session = session
        self.view: LogView | None = None
        sched = session.scheduler
        self._me = _Me(session.host, os.getpid(), sched.job_id, sched.name, session.attempt)
        refusal = None
        if session.rank == 0:
            self.view = LogView.load(session.run)
            refusal = self._refusal(mine=None)
        refusal = dist.broadcast_object(refusal)
        if refusal is not None:
            self._refuse(refusal, recorded=False)

    def confirm(self, started: Event | None) -> None:
        """After ``run_started``: give way to a live job that started before this one."""
        refusal = None
        if self.session.rank == 0:
            assert self.view is not None and isinstance(started, RunStarted)
            self.view.update()
            refusal = self._refusal(mine=started)
        refusal = dist.broadcast_object(refusal)
        if refusal is not None:
            self._refuse(refusal, recorded=True)

    # --- internals ---------------------------------------------------------------------------

    def _refusal(self, mine: RunStarted | None) -> str | None:
        assert self.view is not None
        now = time.time()
        stale = float(self.session.config.stale_after_s)
        for a in sorted(self.view.state.attempts.values(), key=lambda a: a.attempt):
            if not self._live(a, now, stale):
                continue
            if mine is not None and _start_key(a) > (mine.t, mine.host, mine.pid or 0):
                continue  # it started after us: it is the one that gives way
            return self._message(a, now, stale)
        return None

    def _live(self, a: AttemptInfo, now: float, stale: float) -> bool:
        me = self._me
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
        me = self._me
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
            f"{self.session.run.root} is in use by another job: {_describe(a)}; {why}."
            f" This job (job {me.job_id or '-'}, host {me.host}, pid {me.pid}, attempt"
            f" {me.attempt}) refuses to start, so that the two never mix their events or"
            " resume each other's checkpoints. Fix: give this job its own run_dir, or stop"
            f" the other job; {dead}."
        )

    def _refuse(self, message: str, *, recorded: bool) -> None:
        # Reaches into the session on purpose: a refused session must not write anything
        # more (Lightning calls teardown -> close() even when setup raised).
        session = self.session
        writer = session._writer
        if writer is not None:
            if recorded:
                writer.emit(RunFailed, error=f"refused to start: {message}")
            writer.close()
            if not recorded:
                with contextlib.suppress(OSError):
                    if os.stat(writer.path).st_size == 0:
                        os.unlink(writer.path)  # nothing written: leave no trace
        session._closed = True
        raise RunDirError(message)


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
