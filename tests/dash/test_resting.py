"""Idle runs of a folder rest as their summary line; a change or a session's look opens them."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from ckptdash import events
from ckptdash.dash.feed import follow, mounts, resting
from ckptdash.dash.feed.follow import RunFollower
from ckptdash.dash.feed.snapshot import RunSnapshot
from ckptdash.rundir.writer import EventWriter
from tests.dash.conftest import ev

WaitUntil = Callable[..., None]


@pytest.fixture(autouse=True)
def quick_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A resting run's files are looked at every 0.2 s here (5 s in the field)."""
    monkeypatch.setattr(follow, "CHECK_EVERY_S", 0.2)


def run_of(w: RunFollower, name: str) -> RunSnapshot:
    assert w.latest is not None
    return next(r for r in w.latest.runs if r.name == name)


def whole(path: Path) -> RunSnapshot:
    """The run as a follower of it alone shows it (one run never rests)."""
    with RunFollower(path, mode="poll", poll_interval_s=0.05) as w:
        assert w.wait_loaded(10)
        assert w.latest is not None
        (snap,) = w.latest.runs
        assert not snap.summary
        return snap


@pytest.mark.parametrize("mode", ["inotify", "poll"])
def test_an_idle_run_rests_as_its_summary_and_a_new_event_opens_it_whole(
    make_run: Callable[..., Path], wait_until: WaitUntil, tmp_path: Path, mode: mounts.WatchMode
) -> None:
    """Two runs whose last event is long past: both rest (the run list's line, nothing that
    grows with the run); the one that gets a new event is opened again from its files and
    shows everything a fresh read shows, the new event included."""
    a, _ = make_run("a"), make_run("b")
    with RunFollower(tmp_path, mode=mode, poll_interval_s=0.1, refresh_s=0.1) as w:
        assert w.wait_loaded(10)
        wait_until(lambda: run_of(w, "a").summary and run_of(w, "b").summary, what="rest")
        line = run_of(w, "a")
        assert line.checkpoints == () and line.series == {} and line.health is None
        assert line.newest is not None and line.newest.attempt == 2  # the line itself stays
        assert line.events_total == whole(a).events_total
        with EventWriter(a, attempt=2, host="n2") as writer:
            writer.emit(events.Heartbeat, step=777)
        wait_until(lambda: not run_of(w, "a").summary, timeout=5, what="a opened again")
        opened, fresh = run_of(w, "a"), whole(a)
        assert opened.progress is not None and opened.progress.step == 777
        assert opened.checkpoints == fresh.checkpoints and opened.checkpoints
        assert opened.events_total == fresh.events_total == line.events_total + 1
        assert opened.version > line.version
        assert run_of(w, "b").summary  # the other one still rests


def test_a_run_a_session_shows_is_whole_and_rests_again_when_let_go(
    make_run: Callable[..., Path],
    wait_until: WaitUntil,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """focus() (the dashboard's selected run) opens a resting run at once and keeps it
    whole; let go, it rests again once it stayed awake for REST_AFTER_S."""
    monkeypatch.setattr(resting, "REST_AFTER_S", 1.0)
    a, _ = make_run("a"), make_run("b")
    with RunFollower(tmp_path, mode="inotify", refresh_s=0.1) as w:
        assert w.wait_loaded(10)
        wait_until(lambda: run_of(w, "a").summary, what="a rests")
        let_go = w.focus(str(a))
        wait_until(lambda: not run_of(w, "a").summary, timeout=5, what="a whole")
        assert run_of(w, "a").checkpoints == whole(a).checkpoints
        polls = w.polls
        wait_until(lambda: w.polls >= polls + 20, what="polls while it is shown")
        assert not run_of(w, "a").summary and run_of(w, "b").summary
        let_go()
        let_go()  # a second call changes nothing
        wait_until(lambda: run_of(w, "a").summary, timeout=5, what="a rests again")


def test_a_run_running_on_this_host_and_a_lone_run_never_rest(
    make_run: Callable[..., Path], wait_until: WaitUntil, tmp_path: Path
) -> None:
    """A run whose newest attempt says it runs here stays whole, whatever its age: the
    follower's /proc check must still see a kill -9 at once. A follower of one run keeps it."""
    here = socket.gethostname()
    make_run("old")
    live = make_run("live", evs=[ev(events.RunStarted, 0, scheduler="local")])
    with EventWriter(live, attempt=1, host=here) as writer:
        started = ev(events.RunStarted, 10, attempt=1, scheduler="local")
        writer.write(msgspec.structs.replace(started, host=here))
    with RunFollower(tmp_path, mode="poll", poll_interval_s=0.05) as w:
        assert w.wait_loaded(10)
        wait_until(lambda: run_of(w, "old").summary, what="the old run rests")
        polls = w.polls
        wait_until(lambda: w.polls >= polls + 10, what="more polls")
        snap = run_of(w, "live")
        assert snap.newest is not None and snap.newest.host == here
        assert not snap.summary
    with RunFollower(tmp_path / "old", mode="poll", poll_interval_s=0.05) as w:
        assert w.wait_loaded(10)
        wait_until(lambda: w.polls >= 10, what="polls")
        assert w.latest is not None and not w.latest.runs[0].summary
