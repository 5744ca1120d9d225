"""The follower: inotify or polling, new bytes only, new runs, settings, failing views."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckptdash import control, events
from ckptdash.dash.feed import mounts
from ckptdash.dash.feed.follow import RunFollower
from ckptdash.dash.feed.snapshot import FolderSnapshot
from ckptdash.rundir.writer import EventWriter

WaitUntil = Callable[..., None]


class Latest:
    """A subscriber that keeps the last snapshot."""

    def __init__(self) -> None:
        self.snap: FolderSnapshot | None = None
        self.calls = 0
        self.thread = ""

    def __call__(self, snap: FolderSnapshot) -> None:
        self.snap, self.calls = snap, self.calls + 1
        self.thread = threading.current_thread().name

    def run(self, i: int = 0) -> Any:
        assert self.snap is not None
        return self.snap.runs[i]


@pytest.mark.parametrize("mode", ["inotify", "poll"])
def test_appended_events_are_published(
    make_run: Callable[..., Path], wait_until: WaitUntil, mode: mounts.WatchMode
) -> None:
    """Events appended to a run reach the subscribers, from the follower's own thread; with
    inotify the safety poll is much slower than the update (30 s) so inotify did it."""
    root = make_run()
    latest = Latest()
    interval = 0.2 if mode == "poll" else 1.0
    with RunFollower(root, mode=mode, poll_interval_s=interval, refresh_s=30.0) as w:
        w.subscribe(latest)
        wait_until(lambda: latest.snap is not None and latest.snap.runs, what="first load")
        assert latest.run().events_total == 16
        with EventWriter(root, attempt=2, host="n2") as writer:
            writer.emit(events.Heartbeat, step=777)
        wait_until(lambda: latest.run().progress.step == 777, timeout=5, what="the heartbeat")
        assert latest.thread == f"ckptdash-watch:{root.name}"
        assert w.mode == mode


def test_polls_read_only_new_bytes(make_run: Callable[..., Path], wait_until: WaitUntil) -> None:
    """Each event is applied once however many polls run (the tailer keeps its offsets)."""
    root = make_run()
    latest = Latest()
    with RunFollower(root, mode="poll", poll_interval_s=0.05) as w:
        w.subscribe(latest)
        wait_until(lambda: w.polls >= 5, what="several polls")
        with EventWriter(root, attempt=2) as writer:
            writer.emit(events.Heartbeat, step=900)
        wait_until(lambda: w.polls >= 10, what="more polls")
        assert latest.run().events_total == 17


def test_a_new_run_in_the_folder_joins(
    make_run: Callable[..., Path], wait_until: WaitUntil, tmp_path: Path
) -> None:
    """Watching a folder of runs: a run created later appears in the snapshots."""
    make_run("a")
    latest = Latest()
    with RunFollower(tmp_path, mode="inotify", refresh_s=30.0) as w:
        w.subscribe(latest)
        wait_until(lambda: latest.snap is not None and len(latest.snap.runs) == 1)
        assert latest.snap is not None and latest.snap.is_folder
        make_run("b")
        wait_until(lambda: latest.snap is not None and len(latest.snap.runs) == 2, timeout=5)


def test_a_missing_or_empty_folder_is_waited_for_calmly(
    tmp_path: Path, wait_until: WaitUntil
) -> None:
    """A folder that does not exist yet, then exists empty, is no problem (the training will
    create the run): the follower publishes no runs and no problem, and picks the run up when
    its first event appears. A file in place of the folder is a problem, with the fix."""
    latest = Latest()
    with RunFollower(tmp_path / "later", mode="poll", poll_interval_s=0.05) as w:
        w.subscribe(latest)
        wait_until(lambda: latest.snap is not None and latest.snap.loaded)
        assert latest.snap is not None and (latest.snap.problem, latest.snap.runs) == ("", ())
        (tmp_path / "later").mkdir()
        EventWriter(tmp_path / "later", attempt=0).close()
        wait_until(lambda: latest.snap is not None and len(latest.snap.runs) == 1)
        assert latest.snap is not None and latest.snap.problem == ""
    (tmp_path / "a-file").write_text("")
    latest = Latest()
    with RunFollower(tmp_path / "a-file", mode="poll", poll_interval_s=0.05) as w:
        w.subscribe(latest)
        wait_until(lambda: latest.snap is not None and "not a directory" in latest.snap.problem)


def test_settings_changes_are_seen(make_run: Callable[..., Path], wait_until: WaitUntil) -> None:
    """Suspending requeue (a settings file, no event) reaches the snapshot."""
    root = make_run()
    latest = Latest()
    with RunFollower(root, mode="inotify", refresh_s=30.0) as w:
        w.subscribe(latest)
        wait_until(lambda: latest.snap is not None and latest.snap.runs)
        control.update_settings(root, requeue_suspended=True, author="t")
        wait_until(
            lambda: latest.run().settings.requeue_suspended,
            timeout=5,
            what="the settings",
        )


def test_a_failing_subscriber_does_not_stop_the_follower(
    make_run: Callable[..., Path], wait_until: WaitUntil
) -> None:
    """A view that raises is logged; the others keep getting snapshots."""
    root = make_run()
    latest = Latest()

    def broken(snap: FolderSnapshot) -> None:
        raise RuntimeError("a view broke")

    with RunFollower(root, mode="poll", poll_interval_s=0.05) as w:
        w.subscribe(broken)
        w.subscribe(latest)
        wait_until(lambda: latest.calls >= 3, what="three snapshots")
        assert w.running
