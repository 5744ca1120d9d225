"""Out-of-range values in an event line never crash a view nor hide the other runs
(issue 11, finding 8)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from ckptdash import Monitor
from ckptdash.dash.app import Dashboard, DashOptions
from ckptdash.dash.feed.follow import RunFollower
from ckptdash.dash.feed.hub import FollowerHub
from ckptdash.events import decode_metrics
from ckptdash.rundir import RunDir
from ckptdash.state.reading import load_state

ROOT = Path(__file__).resolve().parents[2]
MAX_TIME = 2.0**32  # the latest time and longest duration a line may hold (docs/format.md)
MAX_INT = 2**63 - 1  # the largest step, size, attempt
HOSTILE = [
    {"kind": "heartbeat", "t": 10485849600.0},  # year 2302: a node with a broken clock
    {"kind": "heartbeat", "t": 1e300},
    {"kind": "heartbeat", "t": 1.0, "step": 2**63},
    {"kind": "heartbeat", "t": 1.0, "time_left_s": 1e300},
    {"kind": "heartbeat", "t": 1.0, "metrics": {"loss": 1e308, "n": 10**400, "ok": 0.5}},
    {"kind": "checkpoint_saved", "t": 1.0, "path": "x", "trigger": "api", "size_bytes": 2**64,
     "duration_s": 1.0},
    {"kind": "checkpoint_saved", "t": 1.0, "path": "y", "trigger": "api", "size_bytes": 1,
     "duration_s": 1e300},
]  # fmt: skip


def _runs(folder: Path) -> tuple[Path, Path]:
    good, bad = folder / "good", folder / "bad"
    for run in (good, bad):
        with Monitor(run, install_signals=False) as monitor:
            monitor.step(3)
            monitor.save({"step": 3})
    rd = RunDir(bad)
    envelope = {"v": 1, "run": rd.info().run_id, "attempt": 0, "rank": 0, "host": "h"}
    lines = [json.dumps({**envelope, **record}) for record in HOSTILE]
    text = "\n".join(lines).replace('"NaN"', "NaN") + "\n"
    (rd.events / "A0000.R0000.h.1.jsonl").write_text(text)
    return good, bad


def test_out_of_range_values_are_invalid_lines_and_every_run_still_shows(tmp_path: Path) -> None:
    """Times in year 2300 or 1e300, steps of 2^63, absurd sizes, durations and metrics:
    ``ckptdash status`` (a real process, text and JSON) prints both runs of the folder and
    counts the bad lines; the dashboard's follower loads both runs; the absurd metric values
    are left out of the progress."""
    good, bad = _runs(tmp_path)
    for extra in ([], ["--json"]):
        proc = subprocess.run(
            [sys.executable, "-m", "ckptdash", "status", str(tmp_path), "--no-scheduler", *extra],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        if extra:  # JSON: each run under its path
            assert str(good) in proc.stdout and str(bad) in proc.stdout
        else:  # the folder's table: one line per run, named relative to the folder
            names = {line.split()[0] for line in proc.stdout.splitlines()[1:] if line.strip()}
            assert {"good", "bad"} <= names, proc.stdout
    state = load_state(bad)
    assert state.bad_lines.counts == {"invalid": 6}
    raw = msgspec.Raw(json.dumps(HOSTILE[4]["metrics"]).encode())
    assert decode_metrics(raw) == {"ok": 0.5}
    with RunFollower(tmp_path, mode="poll", poll_interval_s=0.05) as follower:
        assert follower.wait_loaded(30)
        snap = follower.latest
        assert snap is not None and snap.problem == ""
        assert sorted(r.root for r in snap.runs) == sorted([str(good), str(bad)])


def test_the_largest_valid_values_draw_in_the_dashboard(
    tmp_path: Path, wait_until: Callable[..., None], caplog: pytest.LogCaptureFixture
) -> None:
    """The last time and the largest step a line may hold (2^32 s, 2^63-1) are drawn by the
    dashboard (the notebook widget's views: header, table, timeline) without an error."""
    run = tmp_path / "run"
    with Monitor(run, install_signals=False) as monitor:
        monitor.step(3)
        monitor.save({"step": 3})
    rd = RunDir(run)
    envelope = {"v": 1, "run": rd.info().run_id, "attempt": 0, "rank": 0, "host": "h"}
    top = {"t": MAX_TIME, "step": MAX_INT}
    lines = [
        {"kind": "heartbeat", **top, "time_left_s": -MAX_TIME, "metrics": {"loss": 1e300}},
        {"kind": "checkpoint_saved", **top, "path": str(rd.checkpoints / "x"), "trigger": "api",
         "size_bytes": MAX_INT, "duration_s": MAX_TIME},
    ]  # fmt: skip
    text = "".join(json.dumps({**envelope, **line}) + "\n" for line in lines)
    (rd.events / "A0000.R0000.h.1.jsonl").write_text(text)
    assert load_state(run).bad_lines.counts == {}
    hub = FollowerHub()
    dash = Dashboard(run, options=DashOptions(watch="poll"), hub=hub)
    try:
        wait_until(lambda: len(dash.table.table.value) == 2, what="both checkpoints shown")
        with dash.holding_updates():
            pass  # the snapshot has reached every view
        failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert failures == []  # a view that raises is logged by the follower, not raised
    finally:
        dash.close()
        hub.close()
