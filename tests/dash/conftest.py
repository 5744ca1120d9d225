"""Fixtures of the dashboard tests: runs written with the real writer, a follower hub, a
served dashboard, and a check that no test leaves a follower, observer or server running."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ckptdash import events
from ckptdash.dash.feed.hub import FollowerHub
from ckptdash.dash.feed.snapshot import FolderSnapshot, SnapshotBuilder
from ckptdash.events import Event
from ckptdash.rundir.writer import EventWriter
from ckptdash.state import RunState

T0 = 1_764_430_000.0

# Pools that Python, tornado and Panel keep for the whole process; they are not ours to stop.
_PROCESS_POOLS = ("ThreadPoolExecutor", "asyncio_", "Dummy-", "pydevd", "MainThread")


def _ours(thread: threading.Thread) -> bool:
    return not thread.name.startswith(_PROCESS_POOLS)


@pytest.fixture(autouse=True)
def no_leaked_threads(wait_until: Callable[..., None]) -> Iterator[None]:
    """Fail a test that leaves a thread behind (a follower, an inotify observer, a server)."""
    before = set(threading.enumerate())
    yield

    def leaked() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t not in before and _ours(t) and t.is_alive()]

    try:
        wait_until(lambda: not leaked(), timeout=30.0, what="the test's threads to end")
    except pytest.fail.Exception:
        pytest.fail(f"threads left running: {[t.name for t in leaked()]}")


@pytest.fixture
def hub() -> Iterator[FollowerHub]:
    """A follower hub of the test's own; every follower it started is stopped afterwards."""
    h = FollowerHub()
    yield h
    h.close()


def ev(kind: type[Event], t: float, *, attempt: int = 0, rank: int = 0, **fields: Any) -> Event:
    """An event at ``T0 + t`` as the writer would make it."""
    if kind is events.Heartbeat and isinstance(fields.get("metrics"), dict):
        fields["metrics"] = events.encode_metrics(fields["metrics"])
    return kind(t=T0 + t, run="r1", attempt=attempt, rank=rank, host=f"n{attempt}", **fields)


def saved(t: float, path: str, step: int, *, attempt: int = 0, **fields: Any) -> Event:
    """A checkpoint_saved event (trigger periodic, 100 bytes, 2 s) unless told otherwise."""
    fields = {"trigger": "periodic", "size_bytes": 100, "duration_s": 2.0, **fields}
    return ev(events.CheckpointSaved, t, attempt=attempt, path=path, step=step, **fields)


@dataclass
class Scenario:
    """A run state fed by hand, and the snapshots a follower would have published of it."""

    root: str = "/runs/exp1"
    state: RunState = field(default_factory=lambda: RunState("/runs/exp1", "r1"))
    builder: SnapshotBuilder = field(default_factory=lambda: SnapshotBuilder("/runs/exp1"))
    version: int = 0

    def add(self, *evs: Event) -> Scenario:
        self.state.apply_events(evs)
        return self

    def snapshot(self, **settings: Any) -> Any:
        return self.builder.take(
            self.state,
            sightings=0,
            settings=events.Settings(**settings),
            settings_error="",
            settings_key=tuple(sorted(settings.items())),
        )

    def folder(self, now: float, **settings: Any) -> FolderSnapshot:
        self.version += 1
        return FolderSnapshot(
            path=self.root,
            runs=(self.snapshot(**settings),),
            now=now,
            version=self.version,
            loaded=True,
            is_folder=False,
            watching="test",
        )


def preempted_run() -> list[Event]:
    """Attempt 0 saves periodically, is signalled, saves, requeues; attempt 1 resumes, saves,
    and is killed without warning; attempt 2 is training."""
    return [
        ev(events.RunStarted, 0, scheduler="slurm", job_id="77", max_steps=1000, requeue_budget=5),
        ev(events.Heartbeat, 10, step=10, epoch=0, time_left_s=3000.0),
        saved(100, "/ck/a.ckpt", 100),
        saved(200, "/ck/b.ckpt", 200),
        ev(events.Heartbeat, 240, step=240, epoch=0),
        ev(events.SignalReceived, 250, step=250, signal="SIGUSR2", action="requeue"),
        saved(253, "/ck/sig.ckpt", 250, trigger="signal"),
        ev(events.RequeueIssued, 254, step=250, job_id="77", command="scontrol requeue 77"),
        ev(events.RunFinished, 255, step=250, reason="preempted"),
        ev(events.RunStarted, 300, attempt=1, scheduler="slurm", job_id="77", max_steps=1000),
        ev(events.RunResumed, 301, attempt=1, step=250, path="/ck/sig.ckpt", reason="newest"),
        saved(400, "/ck/c.ckpt", 350, attempt=1),
        ev(events.Heartbeat, 460, attempt=1, step=410),
        ev(events.RunStarted, 500, attempt=2, scheduler="slurm", job_id="77", max_steps=1000),
        ev(events.Heartbeat, 510, attempt=2, step=350, time_left_s=3600.0),
        ev(events.Heartbeat, 610, attempt=2, step=450, time_left_s=3500.0),
    ]


@pytest.fixture
def scenario() -> Scenario:
    """A hand-fed run state (see :class:`Scenario`)."""
    return Scenario()


@pytest.fixture
def make_run(tmp_path: Path) -> Callable[..., Path]:
    """``make_run(name="exp1", events=[...])``: a run directory whose attempt files hold the
    events (one EventWriter per attempt, as a job writes them)."""

    def make(name: str = "exp1", evs: list[Event] | None = None) -> Path:
        root = tmp_path / name
        evs = preempted_run() if evs is None else evs
        root.mkdir(parents=True, exist_ok=True)  # the events' run id, as the job's run.json says
        (root / "run.json").write_bytes(b'{"v":1,"run_id":"r1","created_at":0}\n')
        for attempt in sorted({e.attempt for e in evs}):
            with EventWriter(root, attempt=attempt, host=f"n{attempt}") as w:
                for e in evs:
                    if e.attempt == attempt:
                        w.write(e)
        return root

    return make
