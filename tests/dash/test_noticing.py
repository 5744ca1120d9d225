"""A follower's threads and inotify instances do not grow with its runs, and a thread or watch
that cannot be had leaves runs polled, never unshown (issue 35, finding 6)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckptdash import events
from ckptdash.dash.feed import inotify, noticing
from ckptdash.dash.feed.follow import RunFollower
from ckptdash.rundir.writer import EventWriter

WaitUntil = Callable[..., None]


def live_runs(folder: Path, n: int) -> None:
    """``n`` small runs whose job looks alive on another host: none of them may rest."""
    now = time.time()
    for i in range(n):
        with EventWriter(folder / f"r{i:03d}", attempt=0, host="elsewhere") as w:
            w.emit(events.RunStarted, t=now)
            w.emit(events.Heartbeat, t=now, step=i)


def names(w: RunFollower) -> set[str]:
    return set() if w.latest is None else {r.name for r in w.latest.runs}


def test_250_live_runs_cost_two_threads_and_one_inotify_instance(
    tmp_path: Path, wait_until: WaitUntil, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A served folder of 250 awake runs: the follower runs its worker and one inotify reader,
    nothing per run, and every run is watched through that one instance; a new event in any
    run is still noticed at once (the safety poll is a minute away here)."""
    instances: list[inotify.Watches] = []
    real_init = inotify.Watches.__init__

    def counted(self: inotify.Watches, *a: Any, **kw: Any) -> None:
        real_init(self, *a, **kw)
        instances.append(self)

    monkeypatch.setattr(inotify.Watches, "__init__", counted)
    live_runs(tmp_path, 250)
    before = threading.active_count()
    with RunFollower(tmp_path, mode="inotify", refresh_s=60.0) as w:
        assert w.wait_loaded(30)
        wait_until(lambda: len(names(w)) == 250, timeout=30, what="every run listed")
        assert threading.active_count() - before <= 2  # the worker and the inotify reader
        assert len(instances) == 1
        assert len(instances[0]) >= 250 * 3  # each run's own folder, events/ and control/
        w.polls = 0
        with EventWriter(tmp_path / "r123", attempt=0, host="elsewhere") as writer:
            writer.emit(events.Heartbeat, step=9999)

        def stepped() -> bool:
            assert w.latest is not None
            run = next(r for r in w.latest.runs if r.name == "r123")
            return run.progress is not None and run.progress.step == 9999

        wait_until(stepped, timeout=10, what="the new step, through inotify")
    wait_until(lambda: threading.active_count() <= before, what="both threads to end")


def test_a_refused_watch_thread_leaves_the_follower_polling_and_the_run_shown(
    tmp_path: Path, wait_until: WaitUntil, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When no thread can be started for watching (a login node's process limit: Python's
    ``RuntimeError: can't start new thread``), the follower polls and shows the owner's run
    beside the others, and says why in its mode."""
    live_runs(tmp_path, 3)
    real_start = threading.Thread.start

    def refuse(self: threading.Thread) -> None:
        if not self.name.startswith("ckptdash-watch:"):  # only the follower's own worker
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", refuse)
    with RunFollower(tmp_path, mode="inotify", poll_interval_s=0.05) as w:
        assert w.wait_loaded(10)
        wait_until(lambda: names(w) == {"r000", "r001", "r002"}, what="every run shown")
        assert w.mode == "poll" and "can't start new thread" in w.mode_reason
        with EventWriter(tmp_path / "r001", attempt=0, host="elsewhere") as writer:
            writer.emit(events.Heartbeat, step=4242)

        def stepped() -> bool:
            assert w.latest is not None
            run = next(r for r in w.latest.runs if r.name == "r001")
            return run.progress is not None and run.progress.step == 4242

        wait_until(stepped, what="the new step, by polling")


def test_a_folder_out_of_watches_is_polled_and_the_other_runs_are_not_disturbed(
    tmp_path: Path, wait_until: WaitUntil, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ENOSPC`` (the user's inotify watches used up) for one run's folders: that run is
    still shown and followed by the safety poll, the others keep their watches."""
    live_runs(tmp_path, 3)
    real_add = inotify.Watches.add

    def add(self: inotify.Watches, folder: str) -> None:
        if "r001" in folder:
            raise OSError(28, "No space left on device")
        real_add(self, folder)

    monkeypatch.setattr(inotify.Watches, "add", add)
    with RunFollower(tmp_path, mode="inotify", refresh_s=0.1) as w:
        assert w.wait_loaded(10)
        wait_until(lambda: names(w) == {"r000", "r001", "r002"}, what="every run shown")
        assert w.mode == "inotify"
        strategy = w._strategy
        assert isinstance(strategy, noticing.Inotify)
        assert strategy._watches.watching(str(tmp_path / "r000" / "events"))
        assert not strategy._watches.watching(str(tmp_path / "r001" / "events"))
        with EventWriter(tmp_path / "r001", attempt=0, host="elsewhere") as writer:
            writer.emit(events.Heartbeat, step=4242)

        def stepped() -> bool:
            assert w.latest is not None
            run = next(r for r in w.latest.runs if r.name == "r001")
            return run.progress is not None and run.progress.step == 4242

        wait_until(stepped, what="the unwatched run's new step, by the safety poll")
