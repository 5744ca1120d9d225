"""Every file that comes from a run directory is read defensively, and the control channel
never goes through a link (issue 22, points 1, 2, 6 and 7, for a single account).

The group-member versions, with two real accounts, are in test_group_folder.py.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckptdash import Monitor, control
from ckptdash.cli import main as cli
from ckptdash.dash.feed.follow import RunFollower
from ckptdash.errors import ControlError, MalformedControlFile, RunDirError
from ckptdash.events import BadLine, decode_command, decode_line
from ckptdash.humanize import short_id
from ckptdash.rundir import RunDir
from ckptdash.rundir.manifest import MANIFEST_NAME
from ckptdash.schedulers.base import Scheduler
from ckptdash.state.reading import load_state
from ckptdash.train.starting.attempts import attempt_number

ROOT = Path(__file__).resolve().parents[2]
DEEP = b"[" * 5000 + b"]" * 5000


def _within(seconds: float, fn: Callable[[], Any]) -> Any:
    """``fn()``'s result; fails (instead of hanging the suite) when it blocks longer."""
    out: list[Any] = []
    raised: list[BaseException] = []

    def call() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # handed to the caller below
            raised.append(exc)

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"blocked for more than {seconds} s"
    if raised:
        raise raised[0]
    return out[0]


def _run(path: Path, saves: int = 1) -> Path:
    with Monitor(path, install_signals=False) as monitor:
        for step in range(1, saves + 1):
            monitor.step(step)
            monitor.save({"step": step})
    return path


def test_a_suspend_click_never_writes_through_a_linked_control_folder(tmp_path: Path) -> None:
    """control/ replaced by a link to another run's control folder: Suspend (update_settings)
    refuses, naming the link, and the other run's settings.json is untouched; reading the
    settings through the link is refused too."""
    victim, run = _run(tmp_path / "victim"), _run(tmp_path / "run")
    control.update_settings(victim, requeue_suspended=False, author="victim")
    before = RunDir(victim).settings.read_bytes()
    for name in os.listdir(RunDir(run).root / "control"):
        path = RunDir(run).root / "control" / name
        os.rmdir(path) if path.is_dir() else path.unlink()
    os.rmdir(RunDir(run).root / "control")
    (RunDir(run).root / "control").symlink_to(RunDir(victim).root / "control")

    with pytest.raises(ControlError, match="symbolic link"):
        control.update_settings(run, requeue_suspended=True)
    assert RunDir(victim).settings.read_bytes() == before
    with pytest.raises(MalformedControlFile, match="symbolic link"):
        control.read_settings(run)


def test_a_fifo_manifest_never_hangs_monitor_load(tmp_path: Path) -> None:
    """A directory checkpoint whose manifest was replaced by a FIFO: the next attempt's
    Monitor.load() returns at once with the older checkpoint, and reports the newer one
    invalid because its manifest is a FIFO."""
    run = tmp_path / "run"
    with Monitor(run, install_signals=False) as monitor:
        monitor.step(1)
        monitor.save({"step": 1})
        monitor.step(2)
        with monitor.saving(RunDir(run).checkpoints / "step=2") as tmp:
            Path(tmp).mkdir(exist_ok=True)
            (Path(tmp) / "shard0").write_bytes(b"x" * 100)
    manifest = RunDir(run).checkpoints / "step=2" / MANIFEST_NAME
    manifest.unlink()
    os.mkfifo(manifest)

    def load() -> Any:
        with Monitor(run, install_signals=False) as monitor:
            return monitor.load()

    assert _within(60, load)["step"] == 1
    assert cli(["status", str(run), "--no-scheduler"]) == 0


def test_run_json_as_a_fifo_or_dev_zero_fails_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sibling run's run.json that is a FIFO, another's a link to /dev/zero: reading either
    raises at once naming the file; ``ckptdash status RUNS/`` shows the good run and names
    each bad one once; the dashboard's folder view loads and shows the good run."""
    runs = tmp_path / "RUNS"
    good = _run(runs / "good")
    for name, make in (("fifo", os.mkfifo), ("zero", lambda p: os.symlink("/dev/zero", p))):
        bad = _run(runs / name)
        RunDir(bad).run_file.unlink()
        make(RunDir(bad).run_file)
        with pytest.raises(RunDirError, match=r"run\.json"):
            _within(10, RunDir(bad).info)

    assert _within(60, lambda: cli(["status", str(runs), "--no-scheduler"])) == 0
    out, err = capsys.readouterr()
    assert "\ngood " in out
    assert [line for line in err.splitlines() if "not shown" in line] == [
        f"ckptdash: {runs / 'fifo'}: not shown: {runs / 'fifo' / 'run.json'}: cannot read the"
        " run file (a FIFO, not a regular file); replace it with a regular file (or delete it:"
        " ckptdash then names the run after its folder)",
        f"ckptdash: {runs / 'zero'}: not shown: {runs / 'zero' / 'run.json'}: cannot read the"
        " run file (a symbolic link, not followed); replace it with a regular file (or delete"
        " it: ckptdash then names the run after its folder)",
    ]

    def dashboard() -> set[str]:
        with RunFollower(runs, mode="poll", poll_interval_s=0.05) as follower:
            assert follower.wait_loaded(30) and follower.latest is not None
            return {Path(r.root).name for r in follower.latest.runs}

    assert "good" in _within(60, dashboard)
    assert good.exists()


def test_deep_nesting_is_a_bad_line_or_a_rejected_command_never_an_error() -> None:
    """A line or command nested 5,000 deep (msgspec raises RecursionError for it, even in a
    field it skips while looking for the tag) is a corrupt line, or a malformed command."""
    line = b'{"x": ' + DEEP + b', "kind": "heartbeat"}'
    assert isinstance(decode_line(line), BadLine)
    with pytest.raises(MalformedControlFile, match=r"c\.json"):
        decode_command(b'{"x": ' + DEEP + b', "command": "save_now"}', "c.json")


def test_an_out_of_range_attempt_number_in_a_file_name_is_ignored(tmp_path: Path) -> None:
    """An event file named for attempt 2^63-1 (or with 200 digits) does not set the
    next attempt's number: it is numbered after the run's real attempts."""
    run = _run(tmp_path / "run")
    events = RunDir(run).events
    (events / "A9223372036854775807.R0000.evil.1.jsonl").write_bytes(b"")
    (events / f"A{'9' * 200}.R0000.evil.2.jsonl").write_bytes(b"")
    assert attempt_number(RunDir(run), Scheduler({})) == 1


def test_python_m_ckptdash_imports_without_running(tmp_path: Path) -> None:
    """Importing ckptdash.__main__ (as ``panel serve ckptdash`` does for a /components/ URL)
    runs nothing and exits nothing; ``python -m ckptdash`` is still the command."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    imported = subprocess.run(
        [sys.executable, "-c", "import ckptdash.__main__; print('still here')"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert imported.returncode == 0 and imported.stdout == "still here\n", imported.stderr
    command = subprocess.run(
        [sys.executable, "-m", "ckptdash", "--help"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert command.returncode == 0 and "usage" in command.stdout


def test_a_flood_of_30000_junk_files_never_stalls_a_step(tmp_path: Path) -> None:
    """30,000 junk files in the inbox, then a real command: no check before the command is
    claimed costs the training thread more than 10 ms of CPU (it listed and sorted the whole
    folder, ~0.4 s, before), and the command is claimed within 200 checks."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        inbox_flood: Any = importlib.import_module("inbox_flood")  # the benchmark's own helpers
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    run = tmp_path / "run"
    inbox_flood.fill(run, 30_000)
    began = time.perf_counter()
    _wall, cpu, checks = inbox_flood.checks_until_claimed(run, max_checks=200)
    assert max(cpu) < 0.010, f"slowest check {max(cpu) * 1e3:.1f} ms of CPU"
    assert time.perf_counter() - began < 60
    assert checks < 200
    assert len(os.listdir(RunDir(run).inbox)) == 30_000


def test_status_shows_a_spoofed_author(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A command signed by someone else than the account that wrote it (here: this account,
    signing "mallory@evil"): the job records the file's real owner, and ``ckptdash status``
    names it next to the author it claims."""
    run = _run(tmp_path / "run")
    cmd = control.issue(run, "save_now", author="mallory@evil (dashboard)")
    with Monitor(run, install_signals=False, poll_interval_s=0.001) as monitor:
        assert monitor.step(5) is not None
        monitor.save({"step": 5})
    capsys.readouterr()
    assert cli(["status", str(run), "--no-scheduler"]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if short_id(cmd.id) in ln]
    me = control.author_user(control.user_at_host())
    assert f"by mallory@evil (dashboard) (written by {me}: spoofed author)" in line
    received = [
        json.loads(raw)
        for f in RunDir(run).event_files()
        for raw in f.read_text().splitlines()
        if '"command_received"' in raw
    ]
    assert [(r["owner"], r["spoofed"]) for r in received] == [(me, True)]


def test_a_linked_inbox_is_neither_listed_by_the_dashboard_nor_written_by_a_click(
    tmp_path: Path,
) -> None:
    """control/inbox replaced by a link to a private folder holding a command-shaped file:
    the dashboard's state lists none of its files (it reports the folder once instead), and
    a Save now click refuses to drop a command through the link."""
    run, private = _run(tmp_path / "run"), tmp_path / "private"
    private.mkdir()
    (private / "00000000000000000001-deadbeef.json").write_text("{}")
    inbox = RunDir(run).inbox
    os.rmdir(inbox)
    inbox.symlink_to(private)

    state = load_state(run)
    assert "00000000000000000001-deadbeef" not in state.commands
    assert any("symbolic link" in b.detail for b in state.bad_lines.samples)
    with pytest.raises(ControlError, match="symbolic link"):
        control.issue(run, "save_now")
    assert os.listdir(private) == ["00000000000000000001-deadbeef.json"]
