"""The run's log as the start of an attempt reads it: replayed once, then kept current.

:class:`~ckptdash.train.starting.guard.RunGuard` replays it to see which other jobs are
live; :func:`~ckptdash.train.starting.recovery.recover` reads the same replay to settle
what crashed attempts left behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from ckptdash import events as ev_
from ckptdash.events import Event
from ckptdash.rundir import RunDir
from ckptdash.state import RunState
from ckptdash.state.reading import new_state
from ckptdash.tail import RunTailer, TailBatch

_CKPT_TYPES: Final = frozenset(
    {
        ev_.CheckpointStarted,
        ev_.CheckpointSaved,
        ev_.CheckpointFailed,
        ev_.CheckpointRemoved,
        ev_.CheckpointInvalid,
    }
)


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
        view = cls(run, new_state(run), RunTailer(run))

        def pieces() -> Iterator[TailBatch]:
            for batch in view.tailer.batches():
                view._apply(batch.events)
                yield batch

        view.state.apply_all(pieces())
        return view

    def update(self) -> None:
        """Read what was appended since the last look."""
        batch = self.tailer.poll()
        self._apply(batch.events)
        self.state.apply(batch)

    def received_commands(self) -> set[str]:
        """Ids of the commands an attempt of this run has already received (or that wait in
        ``claimed/``): a file copied back into the inbox is rejected, never applied twice."""
        return {
            cid
            for cid, c in self.state.commands.items()
            if c.received_at is not None or c.resolved_at is not None or c.location == "claimed"
        }

    def highest_step_before(self, attempt: int) -> int | None:
        """The highest step an attempt before ``attempt`` was seen at (None: none was)."""
        steps = [
            a.step
            for a in self.state.attempts.values()
            if a.attempt < attempt and a.step is not None
        ]
        return max(steps, default=None)

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
