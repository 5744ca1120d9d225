"""Group steering is explicit, and a flood of the group's inbox never delays the owner
(issue 35): with two real accounts in a setgid group folder, a run whose owner opted in gets a
``control/group-inbox/`` the group may write; a peer's command there is applied and recorded
under the peer's name; with 100,000 junk files in it (300,000 in the benchmark), the owner's
``ckptdash stop`` returns at once and the running job applies it at its next check.

The scene costs about 40 s (most of it the peer making the empty files).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckptdash.tail import RunTailer
from tests.conftest import _wait_until
from tests.security.accounts import PEER, ROOT, as_user, python_as, require_accounts

owner, peer = require_accounts()
JUNK = 100_000  # the benchmark floods 300,000 (benchmarks/inbox_flood.py --group)

FIRST = """
import sys
from ckptdash import Monitor, control
with Monitor(sys.argv[1], install_signals=False) as m:
    m.load(); m.step(1); m.save({"step": 1})
with Monitor(sys.argv[2], install_signals=False) as m:
    m.load(); m.step(1); m.save({"step": 1})
control.update_settings(sys.argv[1], group_steering=True)
"""

PEER_SENDS = """
import sys
from ckptdash import control
print(control.issue(sys.argv[1], "save_now").id)
try:
    control.issue(sys.argv[2], "save_now")
except Exception as exc:
    print("refused:", exc)
"""

FLOOD = """
import os, sys
fd = os.open(f"{sys.argv[1]}/control/group-inbox", os.O_RDONLY)
for i in range(int(sys.argv[2])):
    os.close(os.open(f"junk{i:07d}", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
"""


def _events(run: Path) -> list[Any]:
    return [e for batch in RunTailer(run).batches() for e in batch.events]


@pytest.fixture(scope="module")
def scene() -> Iterator[dict[str, Any]]:
    base = Path(tempfile.mkdtemp(prefix="ckdsec-steer-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        runs = base / "RUNS"
        runs.mkdir()
        os.chown(runs, owner.uid, owner.gid)
        os.chmod(runs, 0o2775)
        steered, closed = runs / "steered", runs / "closed"
        made = python_as(owner, FIRST, str(steered), str(closed))
        assert made.returncode == 0, made.stderr[-3000:]
        # The owner's job: its start opens the group inbox; it trains until a command stops it.
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        job = subprocess.Popen(
            ["setpriv", f"--reuid={owner.uid}", f"--regid={owner.gid}", "--init-groups",
             sys.executable, "-m", "tests.security.train_child", str(steered), "120"],
            cwd=ROOT, env=env, umask=0o002, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            inbox = steered / "control" / "group-inbox"
            _wait_until(inbox.is_dir, 60, "the owner's attempt opens the group inbox")
            sent = python_as(peer, PEER_SENDS, str(steered), str(closed))
            assert sent.returncode == 0, sent.stderr[-3000:]
            peer_id, refused = sent.stdout.splitlines()[:2]
            _wait_until(
                lambda: any(getattr(e, "command_id", "") == peer_id for e in _events(steered)),
                60,
                "the peer's command is received",
            )
            flood = python_as(peer, FLOOD, str(steered), str(JUNK), timeout=300)
            assert flood.returncode == 0, flood.stderr[-3000:]
            began = time.monotonic()
            stop = as_user(owner, [sys.executable, "-m", "ckptdash", "stop", str(steered), "--yes"])
            stop_s = time.monotonic() - began
            assert stop.returncode == 0, stop.stderr
            rc = job.wait(timeout=120)
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
        yield {
            "steered": steered,
            "closed": closed,
            "inbox": inbox,
            "peer_id": peer_id,
            "refused": refused,
            "stop_s": stop_s,
            "rc": rc,
        }
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_opting_in_opens_a_group_inbox_and_nothing_else(scene: dict[str, Any]) -> None:
    """With ``group_steering`` the owner's attempt makes control/group-inbox writable by the
    group (sticky: members cannot remove each other's files); the owner's own inbox and every
    other folder stay closed to the group."""
    st = os.stat(scene["inbox"])
    assert st.st_uid == owner.uid and stat.S_IMODE(st.st_mode) & 0o1070 == 0o1070
    assert not os.stat(scene["steered"] / "control" / "inbox").st_mode & 0o022


def test_without_the_opt_in_the_inbox_is_the_owners(scene: dict[str, Any]) -> None:
    """A peer's command to a run that did not opt in is refused, saying how the owner opens
    it; nothing is left in the run."""
    assert scene["refused"].startswith("refused:") and "group_steering=True" in scene["refused"]
    assert os.listdir(scene["closed"] / "control" / "inbox") == []


def test_the_owners_stop_beats_a_flooded_group_inbox(scene: dict[str, Any]) -> None:
    """100,000 junk files and a peer's command in the group inbox: the owner's ``ckptdash
    stop`` returns in well under the 18.7 s it took before, and the job applies it within a
    second of its issue (the job's own clock, from the log), then ends."""
    assert scene["rc"] == 0
    assert scene["stop_s"] < 10, scene["stop_s"]  # a python start on a loaded CI box
    events = _events(scene["steered"])
    (received,) = [
        e for e in events if e.KIND == "command_received" and e.command == "stop_after_save"
    ]
    (applied,) = [
        e for e in events if e.KIND == "command_applied" and e.command_id == received.command_id
    ]
    issued_at = int(received.command_id.split("-")[0]) / 1e9
    assert applied.t - issued_at < 1.0, applied.t - issued_at


def test_a_peers_command_in_the_group_inbox_is_recorded_as_the_peers(
    scene: dict[str, Any],
) -> None:
    """The peer's command from the group inbox is received with its real author's name."""
    (received,) = [
        e for e in _events(scene["steered"])
        if e.KIND == "command_received" and e.command_id == scene["peer_id"]
    ]  # fmt: skip
    assert received.owner == PEER
