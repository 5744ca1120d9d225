"""A hostile inbox never ends training: odd file names, a blocked done/, replayed and stale
commands, a symlinked settings file, a flood of junk (issue 11, findings 5, 6 and 10)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ckptdash import Monitor, control
from ckptdash.cli import main as cli
from ckptdash.events import Event
from ckptdash.rundir import RunDir
from ckptdash.state.reading import load_state
from ckptdash.tail import RunTailer

ROOT = Path(__file__).resolve().parents[2]


def train(run: Path, seconds: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the tiny training loop as its own process until a command stops it."""
    # The caller's PYTHONPATH first (the ckptdash under test), then this checkout's tests.
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)
    env = {**os.environ, "PYTHONPATH": path}
    cmd = [sys.executable, "-m", "tests.security.train_child", str(run), str(seconds)]
    return subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=seconds + 60, check=False
    )


def events_of(run: Path) -> list[Event]:
    return [e for batch in RunTailer(run).batches() for e in batch.events]


def kinds(run: Path, kind: str) -> list[Any]:
    return [e for e in events_of(run) if kind == e.KIND]


def test_a_non_utf8_file_name_is_left_alone_and_training_goes_on(tmp_path: Path) -> None:
    """A file in the inbox whose name is not UTF-8 (or holds an ANSI escape) is not a command
    name: the job never claims or moves it and goes on to apply the real command; the state
    the dashboard shows lists it as malformed under a safe ``\\xNN`` name; a later attempt
    starts although such a file waits in claimed/, and ``ckptdash status`` prints the run."""
    run = tmp_path / "run"
    rd = RunDir(run)
    rd.ensure()
    inbox = os.fsencode(rd.inbox)
    for name in (b"\xff\xfe.json", b"\x1b[2Jcls.json"):
        with open(os.path.join(inbox, name), "wb") as f:
            f.write(b'{"command": "save_now"}')
    stop = control.issue(run, "stop_after_save")

    first = train(run)
    assert first.returncode == 0, first.stderr[-3000:]
    applied = [e.command_id for e in kinds(run, "command_applied")]
    assert applied == [stop.id]
    assert sorted(os.listdir(inbox)) == [b"\x1b[2Jcls.json", b"\xff\xfe.json"]
    shown = load_state(run).commands
    assert {shown[c].status for c in ("\\xff\\xfe", "\\x1b[2Jcls")} == {"malformed"}

    # Junk in claimed/ (planted, or left by a claimer that died): the next attempt starts.
    with open(os.path.join(os.fsencode(rd.claimed), b"\xfforphan.json"), "wb") as f:
        f.write(b"{}")
    stop2 = control.issue(run, "stop_after_save")
    second = train(run)
    assert second.returncode == 0, second.stderr[-3000:]
    assert stop2.id in {e.command_id for e in kinds(run, "command_applied")}
    assert cli(["status", str(run)]) == 0
    assert cli(["status", str(run), "--json"]) == 0


def test_a_done_folder_that_refuses_the_move_is_an_event_not_the_end(tmp_path: Path) -> None:
    """When the answered command cannot be moved to done/ (a directory of its name is in the
    way), the save still counts, a control_failed event says why, and training goes on to
    the next command; the command is not applied again by the next attempt."""
    run = tmp_path / "run"
    RunDir(run).ensure()
    save = control.issue(run, "save_now", now=time.time() - 1)
    blocker = RunDir(run).done / f"{save.id}.json"
    blocker.mkdir(parents=True)
    (blocker / "keep").write_text("in the way")
    stop = control.issue(run, "stop_after_save")

    proc = train(run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = kinds(run, "control_failed")
    assert [e.command_id for e in failed] == [save.id]
    assert "done" in failed[0].reason
    assert {e.command_id for e in kinds(run, "command_applied")} == {save.id, stop.id}

    shutil.rmtree(blocker)
    stop2 = control.issue(run, "stop_after_save")
    again = train(run)
    assert again.returncode == 0, again.stderr[-3000:]
    applied = [e.command_id for e in kinds(run, "command_applied")]
    assert applied.count(save.id) == 1 and stop2.id in applied


def _monitor(run: Path) -> Monitor:
    return Monitor(run, install_signals=False, poll_interval_s=0.001, agree_interval_s=0.001)


def test_a_command_replayed_after_done_is_rejected_not_applied_again(tmp_path: Path) -> None:
    """Copying a done command back into the inbox does not make the job save again, in the
    same attempt or the next one: it is rejected as replayed, and the dashboard still shows
    the command as applied (its first outcome)."""
    run = tmp_path / "run"
    with _monitor(run) as monitor:
        cmd = control.issue(run, "save_now")
        assert monitor.step(1) is not None
        monitor.save({"step": 1})
        done = RunDir(run).done / f"{cmd.id}.json"
        assert done.exists()
        shutil.copy(done, RunDir(run).inbox / done.name)
        assert monitor.step(2) is None and not monitor.should_save
    shutil.copy(done, RunDir(run).inbox / done.name)
    with _monitor(run) as monitor:
        assert monitor.step(3) is None and not monitor.should_save
    assert [e.command_id for e in kinds(run, "command_applied")] == [cmd.id]
    replays = [e for e in kinds(run, "command_rejected") if e.command_id == cmd.id]
    assert len(replays) == 2 and all("replayed" in e.reason for e in replays)
    assert load_state(run).commands[cmd.id].status == "applied"


def test_a_command_without_expiry_or_far_in_the_future_expires_after_a_day(
    tmp_path: Path,
) -> None:
    """A command issued three days ago with ``expires_at: null``, or with an expiry ten years
    ahead, is answered command_expired, never applied."""
    run = tmp_path / "run"
    RunDir(run).ensure()
    old = time.time() - 3 * 86400
    never = control.issue(run, "save_now", ttl_s=None, now=old)
    far = control.issue(run, "save_now", ttl_s=10 * 365 * 86400.0, now=old)
    with _monitor(run) as monitor:
        assert monitor.step(1) is None and not monitor.should_save
    expired = {e.command_id for e in kinds(run, "command_expired")}
    assert expired == {never.id, far.id}


def test_settings_json_as_a_symlink_is_refused_with_an_event(tmp_path: Path) -> None:
    """A settings.json that is a symbolic link (to a file pinning a checkpoint and suspending
    requeue) is not followed: the resume rule ignores its pin and records why, naming the
    link, and ``control.read_settings`` refuses it."""
    run = tmp_path / "run"
    with _monitor(run) as monitor:
        for step in (1, 2):
            monitor.step(step)
            saved = monitor.save({"step": step})
            assert saved is not None
            if step == 1:
                first = saved.path
    elsewhere = tmp_path / "their-settings.json"
    pinned = {"v": 1, "requeue_suspended": True, "resume_pin": first, "updated_at": 1.0}
    elsewhere.write_text(json.dumps({**pinned, "updated_by": "x"}))
    settings = RunDir(run).settings
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.symlink_to(elsewhere)
    with _monitor(run) as monitor:
        assert monitor.load()["step"] == 2
    invalid = [e for e in kinds(run, "checkpoint_invalid") if e.path == str(settings)]
    assert invalid and "symbolic link" in invalid[0].reason
    with pytest.raises(control.MalformedControlFile, match="symbolic link"):
        control.read_settings(run)


def test_a_flood_of_junk_in_the_inbox_costs_one_step_little(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2,000 junk files in the inbox: the check that ends the inbox's listing (the first, on a
    free machine) claims the real command (issued last) and tries to move that one file alone
    (it tried all 2,000, 2.8 s, when junk was claimed); the junk is never claimed, moved or
    answered."""
    run = tmp_path / "run"
    rd = RunDir(run)
    rd.ensure()
    for i in range(2000):
        (rd.inbox / f"0junk{i:04d}").write_bytes(b"x")
    cmd = control.issue(run, "save_now")
    tried: list[str] = []
    claim_one = control._claim_one

    def counted(rd: RunDir, inbox: int, claimed: int, name: str, *rest: Any) -> bool:
        tried.append(name)
        return claim_one(rd, inbox, claimed, name, *rest)

    monkeypatch.setattr(control, "_claim_one", counted)
    with _monitor(run) as monitor:
        # The listing is bounded in time per check (control.dirs.InboxScan): on a free machine
        # one check lists all 2,000; on a busy one it takes a few more. Either way the real
        # command is the only file ever tried.
        step, decision = 1, monitor.step(1)
        while decision is None and step < 1000:
            step += 1
            decision = monitor.step(step)
        assert decision is not None and decision.trigger == "manual"
        assert tried == [f"{cmd.id}.json"]
        monitor.save({"step": step})
        for later in range(step + 1, step + 50):
            monitor.step(later)
    assert len(os.listdir(rd.inbox)) == 2000
    assert kinds(run, "command_rejected") == []
    assert [e.command_id for e in kinds(run, "command_applied")] == [cmd.id]
