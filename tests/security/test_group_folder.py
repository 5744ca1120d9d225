"""A shared group project folder (setgid, mode 2775, umask 002): a colleague in the group
plants links, FIFOs and hostile files in the owner's run directories, and the owner's real
training job, ``ckptdash status`` and ``ckptdash watch`` neither follow, hang nor die
(issue 22, points 1, 2 and 7).

Two real accounts (tests/security/accounts.py); the owner's job is a real process run as the
owner. One module fixture sets the scene once, each test checks one promise.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ckptdash.rundir import RunDir
from ckptdash.tail import RunTailer
from tests.security.accounts import OWNER, PEER, as_user, python_as, require_accounts

owner, peer = require_accounts()

RUNS_TRAINED = ("done_link", "inbox_link", "peer_claimed", "fifo_ckpt", "deep")
SIBLINGS = ("fifo_runjson", "private_settings")
DEEP = "[" * 5000 + "]" * 5000
FORGED_AUTHOR = f"{OWNER}@login1 (dashboard)"

# What the colleague does, as the colleague: argv[1] is RUNS/, argv[2] the owner's home.
PLANT = f"""
import json, os, sys, time
runs, home = sys.argv[1], sys.argv[2]
def command(cid, **extra):
    now = time.time()
    body = {{"command": "save_now", "v": 1, "id": cid, "t": now,
             "author": {FORGED_AUTHOR!r}, "host": "login1", "expires_at": now + 600}}
    return json.dumps({{**extra, **body}})
def cid(n):
    return f"{{time.time_ns():020d}}-0000bee{{n}}"
def put(path, text, mode=0o664):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    os.write(fd, text.encode()); os.close(fd)

c = f"{{runs}}/done_link/control"
os.rmdir(f"{{c}}/done"); os.symlink(home, f"{{c}}/done")
put(f"{{c}}/inbox/.bashrc", "echo pwned\\n")
signed = cid(1); put(f"{{c}}/inbox/{{signed}}.json", command(signed))
print(signed)

c = f"{{runs}}/inbox_link/control"
os.rmdir(f"{{c}}/inbox"); os.symlink(f"{{home}}/private", f"{{c}}/inbox")

c = f"{{runs}}/peer_claimed/control"
os.rmdir(f"{{c}}/claimed"); os.mkdir(f"{{c}}/claimed")
put(f"{{c}}/inbox/{{cid(2)}}.json", command(cid(2)))

k = f"{{runs}}/fifo_ckpt/checkpoints"
first, second = sorted(os.listdir(k))
os.unlink(f"{{k}}/{{first}}"); os.mkfifo(f"{{k}}/{{first}}")
os.unlink(f"{{k}}/{{second}}"); os.symlink("/dev/zero", f"{{k}}/{{second}}")

c = f"{{runs}}/deep"
deep = '{{"x": ' + {DEEP!r} + ', "command": "save_now"}}'
d1 = cid(3); put(f"{{c}}/control/inbox/{{d1}}.json", deep)
d2 = cid(4); put(f"{{c}}/control/claimed/{{d2}}.json", deep)
put(f"{{c}}/events/A0000.R0001.peer.1.jsonl", deep.replace("command", "kind") + "\\n")
put(f"{{c}}/events/A9223372036854775807.R0000.peer.1.jsonl", "")
print(d1); print(d2)

os.unlink(f"{{runs}}/fifo_runjson/run.json"); os.mkfifo(f"{{runs}}/fifo_runjson/run.json")
put(f"{{runs}}/private_settings/control/settings.json", "{{}}", 0o600)
"""

REOPEN = """
import os, sys
for d, _, _ in os.walk(sys.argv[1]):
    os.chmod(d, 0o2775)
"""


@dataclass
class Scene:
    runs: Path
    home: Path
    private: dict[str, bytes]
    signed: str
    deep_inbox: str
    deep_claimed: str
    second: dict[str, Any]  # run name -> what the second attempt printed
    status: Any
    watch: Any


def _tree(folder: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = Path(dirpath) / name
            out[str(p.relative_to(folder))] = p.read_bytes() if p.is_file() else b"<dir>"
    return out


def _train(runs: Path, names: tuple[str, ...], steps: int) -> dict[str, Any]:
    """One attempt of each run, in one process as the owner: what it printed per run that it
    came through, and under ``""`` the process's exit status and stderr."""
    argv = [sys.executable, "-m", "tests.security.group_child", str(steps)]
    proc = as_user(owner, [*argv, *(str(runs / n) for n in names)], timeout=180)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {"": (proc.returncode, proc.stderr[-4000:]), **{Path(d["run"]).name: d for d in lines}}


@pytest.fixture(scope="module")
def scene() -> Iterator[Scene]:
    base = Path(tempfile.mkdtemp(prefix="ckdsec-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        home = base / "home"  # the owner's home: private, with a .bashrc and a private folder
        (home / "private" / "sub").mkdir(parents=True)
        (home / ".bashrc").write_text("# the owner's own\n")
        (home / "private" / "secret.txt").write_text("the owner's secret\n")
        (home / "private" / "00000000000000000001-deadbeef.json").write_text("{}")
        runs = base / "project" / "RUNS"
        runs.mkdir(parents=True)
        for path in (
            home,
            home / ".bashrc",
            *home.joinpath("private").rglob("*"),
            home / "private",
        ):
            os.chown(path, owner.uid, owner.gid)
        os.chmod(home, 0o700)
        for folder in (runs.parent, runs):
            os.chown(folder, owner.uid, owner.gid)
            os.chmod(folder, 0o2775)  # the group project folder
        private = _tree(home / "private")

        first = _train(runs, RUNS_TRAINED + SIBLINGS, steps=2)  # attempt 0 of every run
        assert first[""][0] == 0, first[""]
        # Runs made before issue 35 (group-writable folders, what umask 002 gave): the plants
        # below are what the owner's next attempt must survive until it tightens them.
        reopened = python_as(owner, REOPEN, str(runs))
        assert reopened.returncode == 0, reopened.stderr[-3000:]
        planted = python_as(peer, PLANT, str(runs), str(home))
        assert planted.returncode == 0, planted.stderr[-3000:]
        signed, deep_inbox, deep_claimed = planted.stdout.split()
        second = _train(runs, RUNS_TRAINED, steps=3)
        ckptdash = [sys.executable, "-m", "ckptdash"]
        status = as_user(owner, [*ckptdash, "status", str(runs), "--no-scheduler"], timeout=60)
        watch = as_user(owner, [*ckptdash, "watch", str(runs), "--once"], timeout=60)
        yield Scene(runs, home, private, signed, deep_inbox, deep_claimed, second, status, watch)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _events(run: Path) -> list[Any]:  # every kind: fields read by name
    return [e for batch in RunTailer(run).batches() for e in batch.events]


def _failures(run: Path) -> list[str]:
    return [e.reason for e in _events(run) if e.KIND == "control_failed" and e.attempt == 1]


def test_a_done_folder_linked_to_the_owners_home_is_never_written_through(scene: Scene) -> None:
    """control/done replaced by a link to the owner's home, a file named .bashrc dropped in
    the inbox: the job moves nothing into the home (its .bashrc intact), leaves .bashrc in
    the inbox, says once why done/ is refused, and trains on."""
    run = scene.runs / "done_link"
    assert (scene.home / ".bashrc").read_text() == "# the owner's own\n"
    assert sorted(os.listdir(scene.home)) == [".bashrc", "private"]
    assert (run / "control" / "inbox" / ".bashrc").exists()
    failures = _failures(run)
    assert any("control/done" in r and "symbolic link" in r for r in failures), failures
    assert len(failures) == len(set(failures))
    assert scene.second["done_link"]["attempt"] == 1


def test_an_inbox_linked_to_a_private_folder_is_refused_and_left_untouched(
    scene: Scene,
) -> None:
    """control/inbox pointed at a private folder of the owner's: nothing in it is claimed or
    moved (files, sub-folders, even a command-shaped name); the refusal is an event."""
    assert "inbox_link" in scene.second, scene.second[""]
    assert _tree(scene.home / "private") == scene.private
    failures = _failures(scene.runs / "inbox_link")
    assert any("control/inbox" in r and "symbolic link" in r for r in failures), failures


def test_a_control_folder_another_account_made_is_refused(scene: Scene) -> None:
    """control/claimed replaced by a folder the colleague owns: the job refuses to move
    commands through it, naming the folder and its owner; the command waits in the inbox."""
    run = scene.runs / "peer_claimed"
    assert "peer_claimed" in scene.second, scene.second[""]
    failures = _failures(run)
    assert any(f"owned by {PEER}" in r for r in failures), failures
    assert len(os.listdir(run / "control" / "inbox")) == 1
    assert os.listdir(run / "control" / "claimed") == []


def test_a_command_signed_with_the_owners_name_records_its_real_owner(scene: Scene) -> None:
    """A command file the colleague wrote and signed "ckdsec_owner@login1 (dashboard)": the
    job records the file's real owner next to the claimed author and flags it as spoofed;
    ``ckptdash status`` shows it."""
    run = scene.runs / "done_link"
    (received,) = [
        e for e in _events(run) if e.KIND == "command_received" and e.command_id == scene.signed
    ]
    assert (received.owner, received.spoofed) == (PEER, True)
    shown = as_user(owner, [sys.executable, "-m", "ckptdash", "status", str(run), "--no-scheduler"])
    assert shown.returncode == 0, shown.stderr
    assert f"written by {PEER}: spoofed author" in shown.stdout


def test_fifo_and_dev_zero_checkpoints_never_hang_the_next_attempt(scene: Scene) -> None:
    """The recorded checkpoints replaced by a FIFO and a link to /dev/zero: the next
    attempt's Monitor.load() returns at once (a fresh start), each candidate reported
    invalid with what it is."""
    run = scene.runs / "fifo_ckpt"
    assert scene.second["fifo_ckpt"]["loaded"] is None
    reasons = " | ".join(
        e.reason for e in _events(run) if e.KIND == "checkpoint_invalid" and e.attempt == 1
    )
    # The link to /dev/zero is refused as a link leaving the run (the rule follows links to
    # their targets now) or, reached otherwise, as a device: either way it is never opened.
    refused_zero = "a device" in reasons or "symbolic link to /dev/zero" in reasons
    assert "a FIFO, not a regular file" in reasons and refused_zero, reasons


def test_deep_nesting_and_huge_attempt_numbers_never_kill_a_start(scene: Scene) -> None:
    """A command nested 5,000 deep in the inbox and another left in claimed/, an event line
    nested 5,000 deep, an event file named for attempt 2^63-1: the next attempt starts as
    attempt 1, rejects both commands saying why, and counts the line as corrupt."""
    run = scene.runs / "deep"
    assert scene.second[""][0] == 0, scene.second[""]
    assert scene.second["deep"]["attempt"] == 1
    rejected = {e.command_id for e in _events(run) if e.KIND == "command_rejected"}
    assert {scene.deep_inbox, scene.deep_claimed} <= rejected


def test_status_and_watch_over_the_folder_report_a_bad_run_and_go_on(scene: Scene) -> None:
    """A sibling run whose run.json is a FIFO, and one whose settings.json is the colleague's
    0600 file: ``ckptdash status RUNS/`` and ``ckptdash watch RUNS/ --once`` (run as the owner)
    finish, name each bad run once, and show or watch every other run."""
    status, watch = scene.status, scene.watch
    assert status.returncode == 0, status.stderr[-3000:]
    (said,) = [line for line in status.stderr.splitlines() if "fifo_runjson" in line]
    assert "fifo_runjson: not shown" in said and "a FIFO" in said
    for name in RUNS_TRAINED:
        assert f"\n{name} " in status.stdout, status.stdout
    assert watch.returncode == 0, watch.stdout + watch.stderr
    said = [line for line in watch.stdout.splitlines() if "private_settings:" in line]
    assert len(said) == 1 and "using the default thresholds" in said[0], watch.stdout  # once
    mode = stat.S_IMODE(os.stat(scene.runs / "private_settings/control/settings.json").st_mode)
    assert mode == 0o600


def test_peer_plants_are_the_peers(scene: Scene) -> None:
    """The scene is what the issue describes: the run folders are the owner's (old runs,
    group-writable until the owner's next attempt tightened them), and what was planted
    belongs to the colleague."""
    run = RunDir(scene.runs / "done_link")
    st = os.stat(run.root / "control")
    assert st.st_uid == owner.uid and st.st_mode & 0o2070 == 0o2050
    assert os.lstat(run.done).st_uid == peer.uid
