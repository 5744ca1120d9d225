"""Every rank's pulse and the in-job watchdog, from one daemon thread per process.

The thread reads the step the main thread last reached (an attribute read) about once a
second and rewrites this rank's pulse record with it (:mod:`ckptdash.rundir.pulses`: one
fixed-size record, so liveness never grows the log; one shared file per node where the
launcher names local ranks, :mod:`ckptdash.train.health.node_pulses`); once a minute it also
appends a ``pulse`` event to the rank's event file, without fsync, for the history. Where
the record cannot be written, every pulse goes to the log as before. The training step itself
pays nothing: no per-step write, no per-step clock read.

Because the pulse comes from its own thread it keeps coming while the main thread is stuck
(a collective that never returns, a deadlocked data loader): a rank that pulses at the same
step for a long time is hung, one that stopped pulsing is dead or frozen. The watchdog part
records the first case in the run itself: once training reached its first step, a main
thread that has not reached another step boundary for ``hung_after_s`` gets an
``alert_raised`` (``hung``, source ``job``), and an ``alert_cleared`` when it moves again — so
a hang is on the record even when no ``ckptdash watch`` runs.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable

from ckptdash.events import AlertCleared, AlertRaised, Pulse
from ckptdash.rundir.pulses import LOG_EVERY_S
from ckptdash.rundir.writer import EventWriter
from ckptdash.train.engine.ticker import Ticker
from ckptdash.train.health.node_pulses import NodePulses, local_rank


class Pulser:
    """Writes this rank's pulse every ``period_s`` and watches its main thread's progress."""

    def __init__(
        self,
        step: Callable[[], int],
        writer: EventWriter,
        *,
        period_s: float,
        hung_after_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._step = step
        self._writer = writer
        self.hung_after_s = hung_after_s
        self._clock = clock
        self._last_step = step()
        self._moved_at = clock()
        self._armed = False  # only once the main thread reached a step (start-up may be long)
        self._since = time.time()  # wall time the main thread reached the step it is at
        self.hung = False
        self._failed = False
        self._logged_at: float | None = None  # the clock at the last pulse in the log
        self._record: NodePulses | None = None
        try:
            self._record = NodePulses(writer, local=local_rank())
        except OSError as exc:  # an old layout's permissions: pulses go to the log instead
            warnings.warn(
                f"ckptdash: no pulse record ({exc}); every pulse goes to the event log",
                RuntimeWarning,
                stacklevel=2,
            )
        self._ticker = Ticker(period_s, self.tick, name="ckptdash-pulse")

    def start(self) -> Pulser:
        self.tick()  # the attempt's first sign of life from this rank, at once
        self._ticker.start()
        return self

    def stop(self) -> None:
        self._ticker.stop()
        if self._record is not None:
            self._record.close()

    def tick(self) -> None:
        """One pulse (and the watchdog's look); never raises into the thread."""
        try:
            self._tick()
        except Exception as exc:  # a full disk must not kill the thread, nor training
            if not self._failed:
                self._failed = True
                warnings.warn(f"ckptdash: pulse not written: {exc}", RuntimeWarning, stacklevel=1)

    def _tick(self) -> None:
        step, now = self._step(), self._clock()
        if step != self._last_step:
            self._last_step, self._moved_at, self._since = step, now, time.time()
            self._armed = True
            if self.hung:
                self.hung = False
                self._writer.emit(
                    AlertCleared,
                    step=step,
                    alert="hung",
                    detail=f"rank {self._writer.rank} reached step {step}",
                    source="job",
                    who=self._who(),
                )
        # Before the first step the main thread's step is not yet the run's (a resumed
        # attempt starts at 0 until the loop reports): the pulse says alive, no step.
        self._pulse(step if self._armed else None, now)
        stuck = now - self._moved_at
        if self._armed and not self.hung and self.hung_after_s > 0 and stuck >= self.hung_after_s:
            self.hung = True
            self._writer.emit(
                AlertRaised,
                step=step,
                alert="hung",
                since=time.time() - stuck + self.hung_after_s,
                detail=f"rank {self._writer.rank}: the training loop has not reached a step"
                f" boundary for {stuck:.0f} s (step {step}; TrainConfig.hung_after_s ="
                f" {self.hung_after_s:g})",
                source="job",
                who=self._who(),
            )

    def _pulse(self, step: int | None, now: float) -> None:
        """The record every tick; the log at the first tick and then once a minute."""
        if self._record is not None:
            t = time.time()
            try:
                self._record.write(t=t, step=step, since=min(self._since, t))
            except OSError as exc:  # every pulse goes to the log from now on
                self._record.close()
                self._record = None
                warnings.warn(
                    f"ckptdash: pulse record not written ({exc}); pulses go to the event log",
                    RuntimeWarning,
                    stacklevel=1,
                )
        due = self._logged_at is None or now - self._logged_at >= LOG_EVERY_S
        if self._record is None or due:
            self._writer.emit(Pulse, step=step)
            self._logged_at = now

    def _who(self) -> str:
        w = self._writer
        return f"watchdog of rank {w.rank} on {w.host} (pid {os.getpid()})"
